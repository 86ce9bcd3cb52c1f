//! Plan compilation and the run loop: errors, workspace reuse after failures, threads.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::*;
use super::{Device, DeviceBuffer, DeviceKernel};
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
        let inner = CpuReference::new().compile(op)?;
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
    let mut ws = other.workspace().unwrap();
    let x = Tensor::zeros(&[2, 3]);
    assert!(matches!(plan.run_with(&mut ws, &[x.view()]), Err(Error::WorkspaceMismatch)));
    assert_eq!(plan.run(&[&x]).unwrap()[0].to_f32_vec(), &[1.0; 6]);
}

#[test]
fn data_shorter_than_its_shape_is_reported_as_such() {
    let registry = Registry::with_builtins();
    let arena = Arena::new();
    let plan = Plan::compile(&exp_then_add(&arena, &registry), &[CpuReference::shared()]).unwrap();
    let mut ws = plan.workspace().unwrap();
    let short = crate::TensorRef { shape: &[2, 3], data: crate::Data::F32(&[0.0; 5]) };
    let err = plan.run_with(&mut ws, &[short]).err().expect("5 elements for [2, 3]");
    assert!(matches!(err, Error::InputLength { index: 0, expected: 6, got: 5, .. }), "{err:?}");
    assert!(!err.to_string().contains("built for"), "{err}");
    assert!(err.to_string().contains("6 elements") && err.to_string().contains("has 5"), "{err}");
    // A wrong shape is still a shape error.
    let wrong = crate::TensorRef { shape: &[3, 2], data: crate::Data::F32(&[0.0; 6]) };
    assert!(matches!(plan.run_with(&mut ws, &[wrong]), Err(Error::InputShape { index: 0, .. })));
}

#[test]
fn a_workspace_too_large_to_allocate_is_an_error() {
    let registry = Registry::with_builtins();
    let arena = Arena::new();
    let mut b = TraceBuilder::new(&arena, &registry);
    // A usable shape (4 EiB of f32) that no machine can allocate.
    let x = b.input(&[1 << 60]).unwrap();
    let y = b.exp(x).unwrap();
    b.output(y).unwrap();
    let plan = Plan::compile(&b.finish().unwrap(), &[CpuReference::shared()]).unwrap();
    let err = plan.workspace().err().expect("a workspace of 4 EiB");
    assert!(matches!(&err, Error::OutOfMemory { shape, .. } if shape == &[1 << 60]), "{err}");
    assert!(err.to_string().contains("Plan::workspace"), "{err}");
    assert!(matches!(plan.run(&[&Tensor::zeros(&[1])]), Err(Error::OutOfMemory { .. })));
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
    let mut ws = plan.workspace().unwrap();

    fail.store(true, Ordering::Relaxed);
    assert!(matches!(plan.run_with(&mut ws, &[x.view()]), Err(Error::Execution { .. })));
    fail.store(false, Ordering::Relaxed);
    assert_eq!(plan.run_with(&mut ws, &[x.view()]).unwrap().get(0).unwrap().data, crate::Data::F32(&[1.0; 6]));

    panic.store(true, Ordering::Relaxed);
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = plan.run_with(&mut ws, &[x.view()]);
    }));
    assert!(caught.is_err());
    panic.store(false, Ordering::Relaxed);
    assert_eq!(plan.run_with(&mut ws, &[x.view()]).unwrap().get(0).unwrap().data, crate::Data::F32(&[1.0; 6]));
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
    assert_eq!(out[0].to_f32_vec(), &[1.0, -2.0]);
    assert_eq!(out[1].to_f32_vec(), &[-1.0, 2.0]);
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
                    for (o, v) in out[0].to_f32_vec().iter().zip(x.to_f32_vec()) {
                        assert!((o - (v.exp() + v)).abs() < 1e-6);
                    }
                }
            });
        }
    });
}

/// A device whose memory is host memory: tests the upload/download plumbing without a GPU.
struct HostMemoryDevice;

struct HostMemory(Vec<f32>);

impl DeviceBuffer for HostMemory {
    fn len(&self) -> usize {
        self.0.len()
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }
}

fn memory(buffer: &dyn DeviceBuffer) -> &[f32] {
    &buffer.as_any().downcast_ref::<HostMemory>().expect("our buffer").0
}

impl Device for HostMemoryDevice {
    fn name(&self) -> &str {
        "host-memory"
    }
    fn alloc(&self, len: usize) -> crate::Result<Box<dyn DeviceBuffer>> {
        Ok(Box::new(HostMemory(vec![0.0; len])))
    }
    fn upload(&self, source: &[f32], target: &mut dyn DeviceBuffer) -> crate::Result<()> {
        TRANSFERS.with(|t| t.set((t.get().0 + 1, t.get().1)));
        target.as_any_mut().downcast_mut::<HostMemory>().expect("our buffer").0.copy_from_slice(source);
        Ok(())
    }
    fn download(&self, source: &dyn DeviceBuffer, target: &mut [f32]) -> crate::Result<()> {
        TRANSFERS.with(|t| t.set((t.get().0, t.get().1 + 1)));
        target.copy_from_slice(memory(source));
        Ok(())
    }
}

/// A buffer that says it holds `.0` words without holding them: what a device's handle to memory
/// too large for the host reports.
struct Claimed(usize);

impl DeviceBuffer for Claimed {
    fn len(&self) -> usize {
        self.0
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }
}

#[test]
fn the_default_device_copy_reports_what_the_host_cannot_hold() {
    // Through the host, as the default copy goes: a buffer larger than the host's memory is an
    // error naming it, not an abort, and a short source is refused before anything is allocated.
    let huge = usize::MAX / 8;
    match HostMemoryDevice.copy(&Claimed(huge), &mut Claimed(huge)) {
        Err(Error::OutOfMemory { what, bytes, .. }) => {
            assert!(what.contains("Device::copy"), "{what}");
            assert_eq!(bytes, huge * 4);
        }
        other => panic!("expected OutOfMemory, got {:?}", other.map(|_| ())),
    }
    match HostMemoryDevice.copy(&Claimed(3), &mut Claimed(huge)) {
        Err(Error::TransferLength { direction: "copy", host, device: 3 }) => assert_eq!(host, huge),
        other => panic!("expected TransferLength, got {:?}", other.map(|_| ())),
    }
}

thread_local! {
    /// `(uploads, downloads)` made by host-memory devices on this thread.
    static TRANSFERS: std::cell::Cell<(usize, usize)> = const { std::cell::Cell::new((0, 0)) };
}

/// The transfers made by `f` on this thread.
fn transfers_during(f: impl FnOnce()) -> (usize, usize) {
    let before = TRANSFERS.with(|t| t.get());
    f();
    let after = TRANSFERS.with(|t| t.get());
    (after.0 - before.0, after.1 - before.1)
}

/// Runs `exp` "on the device".
struct DeviceExp;

struct ExpOnDevice;

thread_local! {
    /// How many op guards are entered on this thread.
    static GUARDED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    /// Whether `ExpOnDevice` panics on this thread (a user's kernel that does).
    static PANICS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// Whether `ExpOnDevice` panics while a `CapturingHostDevice` captures, on this thread.
    static PANICS_IN_CAPTURE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Attaches to every op the guard that `ExpOnDevice` checks it runs inside.
fn attach_guarded(trace: &mut crate::Trace<'_>) {
    let guard = crate::guards::ClosureGuard::new(
        || GUARDED.with(|g| g.set(g.get() + 1)),
        || GUARDED.with(|g| g.set(g.get() - 1)),
    );
    trace.attach_guard(crate::guards::Selection::All, guard).unwrap();
}

impl DeviceKernel for ExpOnDevice {
    fn run(&self, inputs: &[&dyn DeviceBuffer], outputs: &mut [&mut dyn DeviceBuffer]) -> crate::Result<()> {
        assert!(!PANICS.with(|p| p.get()), "a kernel that panics");
        if GUARDED.with(|g| g.get()) == 0 {
            return Err(Error::Execution {
                executor: "device_exp".into(),
                symbol: "exp".into(),
                message: "ran outside its guard".into(),
            });
        }
        let x = memory(inputs[0]).to_vec();
        let out = &mut outputs[0].as_any_mut().downcast_mut::<HostMemory>().expect("our buffer").0;
        for (o, v) in out.iter_mut().zip(x) {
            *o = crate::executors::math::exp(v);
        }
        Ok(())
    }

    fn launch_note(&self) -> Option<String> {
        Some("one host thread".into())
    }
}

impl Executor for DeviceExp {
    fn name(&self) -> &str {
        "device_exp"
    }
    fn claims(&self, op: &OpView<'_>) -> bool {
        op.symbol_id() == prims::EXP
    }
    fn device(&self) -> Option<Arc<dyn Device>> {
        Some(Arc::new(HostMemoryDevice))
    }
    fn compile_device(&self, _op: &OpView<'_>) -> crate::Result<Box<dyn DeviceKernel>> {
        Ok(Box::new(ExpOnDevice))
    }
}

#[test]
fn device_steps_get_explicit_transfers() {
    let registry = Registry::with_builtins();
    let arena = Arena::new();
    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input(&[2, 3]).unwrap();
    let e = b.exp(x).unwrap(); // device: upload x first
    let f = b.exp(e).unwrap(); // device: e is already there
    let g = b.add(f, x).unwrap(); // host: download f first
    let h = b.exp(g).unwrap(); // device again: upload g; the output is downloaded at the end
    b.output(h).unwrap();
    let mut trace = b.finish().unwrap();
    // Every op runs inside its own guard (the device kernel checks), transfers included.
    attach_guarded(&mut trace);
    let recorder = crate::guards::Recorder::new();
    trace.attach_guard(crate::guards::Selection::All, recorder.clone()).unwrap();
    let plan = Plan::compile(&trace, &[Arc::new(DeviceExp), CpuReference::shared()]).unwrap();
    let listing = plan.to_string();
    let order: Vec<&str> = listing.lines().filter(|l| !l.starts_with('#')).map(|l| l.trim()).collect();
    assert!(
        order[0].starts_with("upload t0") && order[1].starts_with("t1 = exp") && order[2].starts_with("t2 = exp"),
        "{listing}"
    );
    assert!(
        order[3].starts_with("download t2") && order[4].starts_with("t3 = add") && order[5].starts_with("upload t3"),
        "{listing}"
    );
    assert!(order[6].starts_with("t4 = exp") && order[7].starts_with("download t4"), "{listing}");
    // A kernel's launch note follows its executor in the listing; transfers have none.
    assert_eq!(listing.matches(", device_exp, one host thread\n").count(), 3, "{listing}");
    assert!(!listing.contains("runtime, one host thread"), "{listing}");
    let input = Tensor::from_fn(&[2, 3], |i| i as f32 * 0.1);
    let got = plan.run(&[&input]).unwrap();
    let labels: Vec<String> = recorder.ranges().iter().map(|r| r.label.to_string()).collect();
    assert_eq!(labels, ["exp", "exp", "add", "exp"]);
    let reference = Plan::compile(&trace, &[CpuReference::shared()]).unwrap();
    assert_eq!(got, reference.run(&[&input]).unwrap());
    let mut ws = plan.workspace().unwrap();
    for _ in 0..3 {
        let out = plan.run_with(&mut ws, &[input.view()]).unwrap();
        assert_eq!(out.get(0).unwrap().to_tensor(), reference.run(&[&input]).unwrap()[0]);
    }
}

/// `exp(exp(x))` over `x: [2, 3]`.
fn exp_twice<'a>(arena: &'a Arena, registry: &'a Registry) -> crate::Trace<'a> {
    let mut b = TraceBuilder::new(arena, registry);
    let x = b.input(&[2, 3]).unwrap();
    let e = b.exp(x).unwrap();
    let f = b.exp(e).unwrap();
    b.output(f).unwrap();
    b.finish().unwrap()
}

#[test]
fn inputs_given_on_the_device_and_outputs_left_there_make_no_transfer() {
    let (registry, arena) = (Registry::with_builtins(), Arena::new());
    let trace = exp_twice(&arena, &registry);
    let plan = Plan::compile(&trace, &[Arc::new(DeviceExp), CpuReference::shared()]).unwrap();
    // Every op inside a guard, as the device kernel checks.
    GUARDED.with(|g| g.set(1));
    let host = Tensor::from_fn(&[2, 3], |i| i as f32 * 0.1);
    let expected = Plan::compile(&trace, &[CpuReference::shared()]).unwrap().run(&[&host]).unwrap();
    let mut ws = plan.workspace().unwrap();
    // Host in, host out: the upload and the download in the listing, each run.
    let host_run = transfers_during(|| {
        plan.run_with(&mut ws, &[host.view()]).unwrap();
    });
    assert_eq!(host_run, (1, 1));
    // The input uploaded once, then read where it is.
    let device = plan.device().unwrap().clone();
    let on_device = DeviceTensor::upload(&device, host.view()).unwrap();
    let inputs = [RunInput::from(&on_device)];
    assert_eq!(
        transfers_during(|| {
            plan.run_with(&mut ws, &inputs).unwrap();
        }),
        (0, 1)
    );
    let mut got = None;
    assert_eq!(
        transfers_during(|| {
            plan.run_on_device(&mut ws, &inputs).unwrap();
        }),
        (0, 0)
    );
    assert_eq!(
        transfers_during(|| got = Some(plan.run_on_device(&mut ws, &inputs).unwrap().to_host(0).unwrap())),
        (0, 1)
    );
    assert_eq!(got.unwrap(), expected[0]);
    // Host inputs still work with outputs left on the device.
    let outputs = plan.run_on_device(&mut ws, &[host.view()]).unwrap();
    assert!(outputs.device_buffer(0).is_some());
    assert_eq!(outputs.to_host(0).unwrap(), expected[0]);
    GUARDED.with(|g| g.set(0));

    // A tensor of another device, or of another shape: typed errors.
    let elsewhere: Arc<dyn Device> = Arc::new(HostMemoryDevice);
    let foreign = DeviceTensor::upload(&elsewhere, host.view()).unwrap();
    let err = plan.run_with(&mut ws, &[RunInput::from(&foreign)]).err().unwrap();
    assert!(matches!(err, Error::InputPlacement { index: 0, .. }), "{err}");
    let wrong = DeviceTensor::upload(&device, Tensor::zeros(&[3, 2]).view()).unwrap();
    let err = plan.run_with(&mut ws, &[RunInput::from(&wrong)]).err().unwrap();
    assert!(matches!(err, Error::InputShape { index: 0, .. }), "{err}");
    // A plan that reads the input on the host too refuses it on the device (no silent copy).
    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input(&[2, 3]).unwrap();
    let e = b.exp(x).unwrap();
    let y = b.add(e, x).unwrap();
    b.output(y).unwrap();
    let mixed = Plan::compile(&b.finish().unwrap(), &[Arc::new(DeviceExp), CpuReference::shared()]).unwrap();
    let on_its_device = DeviceTensor::upload(mixed.device().unwrap(), host.view()).unwrap();
    let err = mixed.run_with(&mut mixed.workspace().unwrap(), &[RunInput::from(&on_its_device)]).err().unwrap();
    assert!(matches!(err, Error::InputPlacement { index: 0, .. }), "{err}");
    assert!(err.to_string().contains("a host step of this plan reads it"), "{err}");
}

#[test]
fn plans_that_cannot_be_replayed_as_graphs_say_why() {
    let registry = Registry::with_builtins();
    let arena = Arena::new();
    let host = Tensor::from_fn(&[2, 3], |i| i as f32 * 0.1);
    // No device at all.
    let cpu = Plan::compile(&exp_then_add(&arena, &registry), &[CpuReference::shared()]).unwrap();
    let err = cpu.capture(&mut cpu.workspace().unwrap(), Vec::new()).err().unwrap();
    assert!(matches!(err, Error::GraphUnsupported { .. }) && err.to_string().contains("no device steps"), "{err}");
    // A host step.
    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input(&[2, 3]).unwrap();
    let e = b.exp(x).unwrap();
    let y = b.add(e, e).unwrap();
    b.output(y).unwrap();
    let mixed = Plan::compile(&b.finish().unwrap(), &[Arc::new(DeviceExp), CpuReference::shared()]).unwrap();
    let mut on_device = DeviceTensor::upload(mixed.device().unwrap(), host.view()).unwrap();
    let err = mixed.capture(&mut mixed.workspace().unwrap(), vec![&mut on_device]).err().unwrap();
    assert!(err.to_string().contains("runs on the host"), "{err}");
    // A device that cannot capture.
    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input(&[2, 3]).unwrap();
    let e = b.exp(x).unwrap();
    b.output(e).unwrap();
    let device_only = Plan::compile(&b.finish().unwrap(), &[Arc::new(DeviceExp)]).unwrap();
    GUARDED.with(|g| g.set(1));
    let mut on_device = DeviceTensor::upload(device_only.device().unwrap(), host.view()).unwrap();
    let err = device_only.capture(&mut device_only.workspace().unwrap(), vec![&mut on_device]).err().unwrap();
    GUARDED.with(|g| g.set(0));
    assert!(err.to_string().contains("cannot capture"), "{err}");
}

/// A host-memory device that captures, its graphs launching nothing but counting launches:
/// the plan layer's graph bookkeeping without a GPU.
/// Its queues are named, and it records which one each run enters.
#[derive(Default)]
struct CapturingHostDevice {
    launches: Arc<std::sync::atomic::AtomicUsize>,
    entered: std::sync::Mutex<Vec<&'static str>>,
}

/// A queue of `CapturingHostDevice`, by name.
struct NamedQueue(&'static str);

impl super::DeviceQueue for NamedQueue {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

struct CountingGraph(Arc<std::sync::atomic::AtomicUsize>);

impl super::DeviceGraph for CountingGraph {
    fn launch(&self) -> crate::Result<()> {
        self.0.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

impl Device for CapturingHostDevice {
    fn name(&self) -> &str {
        "capturing-host-memory"
    }
    fn alloc(&self, len: usize) -> crate::Result<Box<dyn DeviceBuffer>> {
        HostMemoryDevice.alloc(len)
    }
    fn upload(&self, source: &[f32], target: &mut dyn DeviceBuffer) -> crate::Result<()> {
        HostMemoryDevice.upload(source, target)
    }
    fn download(&self, source: &dyn DeviceBuffer, target: &mut [f32]) -> crate::Result<()> {
        HostMemoryDevice.download(source, target)
    }
    fn new_queue(&self) -> crate::Result<Option<Box<dyn super::DeviceQueue>>> {
        Ok(Some(Box::new(NamedQueue("its own"))))
    }
    fn device_queue(&self) -> crate::Result<Option<Box<dyn super::DeviceQueue>>> {
        Ok(Some(Box::new(NamedQueue("the device's"))))
    }
    fn enter_queue(&self, queue: &dyn super::DeviceQueue) -> crate::Result<()> {
        let name = queue.as_any().downcast_ref::<NamedQueue>().unwrap().0;
        self.entered.lock().unwrap().push(name);
        Ok(())
    }
    fn begin_capture(&self) -> crate::Result<()> {
        PANICS.with(|p| p.set(PANICS_IN_CAPTURE.with(|c| c.get())));
        Ok(())
    }
    fn end_capture(&self) -> crate::Result<Box<dyn super::DeviceGraph>> {
        PANICS.with(|p| p.set(false));
        Ok(Box::new(CountingGraph(self.launches.clone())))
    }
}

/// `DeviceExp` on a device that captures.
struct CapturingExp(Arc<CapturingHostDevice>);

impl Executor for CapturingExp {
    fn name(&self) -> &str {
        "capturing_exp"
    }
    fn claims(&self, op: &OpView<'_>) -> bool {
        op.symbol_id() == prims::EXP
    }
    fn device(&self) -> Option<Arc<dyn Device>> {
        Some(self.0.clone())
    }
    fn compile_device(&self, _op: &OpView<'_>) -> crate::Result<Box<dyn DeviceKernel>> {
        Ok(Box::new(ExpOnDevice))
    }
}

/// `exp` over `[2, 3]`, compiled for a device that captures, and that device.
fn exp_on_a_capturing_device() -> (Plan, Arc<CapturingHostDevice>) {
    let registry = Registry::with_builtins();
    let arena = Arena::new();
    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input(&[2, 3]).unwrap();
    let e = b.exp(x).unwrap();
    b.output(e).unwrap();
    let device = Arc::new(CapturingHostDevice::default());
    let plan = Plan::compile(&b.finish().unwrap(), &[Arc::new(CapturingExp(device.clone()))]).unwrap();
    (plan, device)
}

/// A replay reads the memory its inputs held when captured: refilled in place they replay, but
/// an input replaced (or swapped) through `input_mut` makes the replay fail, naming it, rather
/// than read memory the old tensor freed.
#[test]
fn a_replay_refuses_an_input_replaced_since_the_capture() {
    let (plan, device) = exp_on_a_capturing_device();
    let host = Tensor::from_fn(&[2, 3], |i| i as f32);
    GUARDED.with(|g| g.set(1)); // the capture runs unguarded; the test kernel checks its guard
    let mut x = DeviceTensor::upload(plan.device().unwrap(), host.view()).unwrap();
    let mut other = DeviceTensor::upload(plan.device().unwrap(), host.view()).unwrap();
    let mut workspace = plan.workspace().unwrap();
    let mut graph = plan.capture(&mut workspace, vec![&mut x]).unwrap();
    graph.replay().unwrap();
    graph.input_mut(0).unwrap().copy_from_host(host.view()).unwrap();
    graph.replay().unwrap();
    assert_eq!(device.launches.load(Ordering::Relaxed), 2);
    std::mem::swap(graph.input_mut(0).unwrap(), &mut other);
    let err = graph.replay().err().unwrap();
    assert!(matches!(err, Error::GraphUnsupported { .. }) && err.to_string().contains("input 0"), "{err}");
    // Swapped back, it replays again; assigned a new tensor, it does not.
    std::mem::swap(graph.input_mut(0).unwrap(), &mut other);
    graph.replay().unwrap();
    *graph.input_mut(0).unwrap() = DeviceTensor::upload(plan.device().unwrap(), host.view()).unwrap();
    assert!(graph.replay().is_err());
    // Replaced by a tensor made after the one it replaced was dropped (whose buffer object may
    // take the freed one's address).
    let replaced = std::mem::replace(graph.input_mut(0).unwrap(), other);
    drop(replaced);
    *graph.input_mut(0).unwrap() = DeviceTensor::upload(plan.device().unwrap(), host.view()).unwrap();
    assert!(graph.replay().is_err());
    GUARDED.with(|g| g.set(0));
    assert_eq!(device.launches.load(Ordering::Relaxed), 3);
}

/// A kernel that panics while a run is captured leaves a workspace that its next run rebuilds,
/// as a panic in a run does: it had lost the buffers its steps had taken, and every later run
/// failed ("a device buffer is missing").
#[test]
fn a_workspace_stays_usable_after_a_kernel_panicked_in_a_capture() {
    let (plan, _) = exp_on_a_capturing_device();
    let host = Tensor::from_fn(&[2, 3], |i| i as f32 * 0.1);
    let mut x = DeviceTensor::upload(plan.device().unwrap(), host.view()).unwrap();
    let mut workspace = plan.workspace().unwrap();
    GUARDED.with(|g| g.set(1));
    // The uncaptured run the capture makes first passes; the captured one panics.
    PANICS_IN_CAPTURE.with(|c| c.set(true));
    let captured = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        plan.capture(&mut workspace, vec![&mut x]).map(|_| ())
    }));
    PANICS_IN_CAPTURE.with(|c| c.set(false));
    assert!(captured.is_err(), "the capture panicked");
    let out = plan.run_on_device(&mut workspace, &[RunInput::from(&x)]).unwrap().to_host(0).unwrap();
    GUARDED.with(|g| g.set(0));
    let expected: Vec<f32> = host.to_f32_vec().iter().map(|&v| crate::executors::math::exp(v)).collect();
    assert_eq!(out.to_f32_vec(), expected);
}

/// `Plan::workspace_on_device_queue` runs on the queue the device gives for that
/// (`Device::device_queue`), also after its next run rebuilds it from a panic; `Plan::workspace`
/// on a queue of its own. Such a workspace is refused a capture before anything runs, even by
/// a device that can capture.
#[test]
fn a_workspace_on_the_device_queue_keeps_to_it() {
    let (plan, device) = exp_on_a_capturing_device();
    let host = Tensor::from_fn(&[2, 3], |i| i as f32 * 0.1);
    let mut x = DeviceTensor::upload(plan.device().unwrap(), host.view()).unwrap();
    let (mut own, mut shared) = (plan.workspace().unwrap(), plan.workspace_on_device_queue().unwrap());
    GUARDED.with(|g| g.set(1));
    let err = plan.capture(&mut shared, vec![&mut x]).err().unwrap();
    assert!(matches!(err, Error::GraphUnsupported { .. }), "{err}");
    assert!(err.to_string().contains("made by `Plan::workspace`"), "{err}");
    assert!(device.entered.lock().unwrap().is_empty(), "nothing ran before the refusal");
    plan.run_on_device(&mut own, &[RunInput::from(&x)]).unwrap();
    plan.run_on_device(&mut shared, &[RunInput::from(&x)]).unwrap();
    // A panic mid-run: the next run rebuilds the workspace, on the device's queue still.
    PANICS.with(|p| p.set(true));
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        plan.run_on_device(&mut shared, &[RunInput::from(&x)]).map(|_| ())
    }));
    PANICS.with(|p| p.set(false));
    assert!(panicked.is_err());
    let out = plan.run_on_device(&mut shared, &[RunInput::from(&x)]).unwrap().to_host(0).unwrap();
    GUARDED.with(|g| g.set(0));
    let expected: Vec<f32> = host.to_f32_vec().iter().map(|&v| crate::executors::math::exp(v)).collect();
    assert_eq!(out.to_f32_vec(), expected);
    let entered = device.entered.lock().unwrap().clone();
    assert_eq!(entered, ["its own", "the device's", "the device's", "the device's"]);
}

#[test]
fn a_value_returned_twice_from_the_device_reads_the_same_on_the_host() {
    let registry = Registry::with_builtins();
    let arena = Arena::new();
    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input(&[2, 3]).unwrap();
    let e = b.exp(x).unwrap();
    b.output(e).unwrap();
    b.output(e).unwrap();
    let plan = Plan::compile(&b.finish().unwrap(), &[Arc::new(DeviceExp), CpuReference::shared()]).unwrap();
    GUARDED.with(|g| g.set(1));
    let host = Tensor::from_fn(&[2, 3], |i| i as f32 * 0.1);
    let mut ws = plan.workspace().unwrap();
    let outputs = plan.run_on_device(&mut ws, &[host.view()]).unwrap();
    let (first, second) = (outputs.to_host(0).unwrap(), outputs.to_host(1).unwrap());
    GUARDED.with(|g| g.set(0));
    assert_eq!(first, second);
    assert!((first.to_f32_vec()[1] - 0.1f32.exp()).abs() < 1e-6, "{first:?}");
}

#[test]
fn executors_on_two_devices_or_short_uploads_are_typed_errors() {
    let registry = Registry::with_builtins();
    let arena = Arena::new();
    let trace = exp_then_add(&arena, &registry);
    // DeviceExp makes a new device handle each time it is asked: two of them are two devices.
    let err = Plan::compile(&trace, &[Arc::new(DeviceExp), Arc::new(DeviceExp)]).unwrap_err();
    assert!(matches!(err, Error::DeviceMismatch { .. }), "{err}");
    assert!(err.to_string().contains("two device objects that are both named `host-memory`"), "{err}");
    let device: Arc<dyn Device> = Arc::new(HostMemoryDevice);
    let short = crate::core::tensor::TensorRef { shape: &[4], data: crate::Data::F32(&[1.0]) };
    let err = DeviceTensor::upload(&device, short).unwrap_err();
    assert!(matches!(err, Error::InvalidTensor { .. }), "{err}");
    let mut tensor = DeviceTensor::upload(&device, Tensor::zeros(&[4]).view()).unwrap();
    // Errors name the tensor's and the data's dtype and shape (no input index: it is no input).
    let err = tensor.copy_from_host(Tensor::zeros(&[2]).view()).unwrap_err();
    assert!(matches!(err, Error::CopyMismatch { .. }), "{err}");
    assert!(err.to_string().contains("cannot copy f32[2] host data into a device tensor of f32[4]"), "{err}");
    let err = tensor.copy_from_host(Tensor::zeros(&[4]).to_dtype(crate::DType::BF16).view()).unwrap_err();
    assert!(err.to_string().contains("cannot copy bf16[4] host data into a device tensor of f32[4]"), "{err}");
    tensor.copy_from_host(Tensor::from_fn(&[4], |i| i as f32).view()).unwrap();
    assert_eq!(tensor.to_host().unwrap().to_f32_vec(), &[0.0, 1.0, 2.0, 3.0]);
}

#[test]
fn a_host_plan_run_on_device_gives_its_outputs_on_the_host() {
    let registry = Registry::with_builtins();
    let arena = Arena::new();
    let plan = Plan::compile(&exp_then_add(&arena, &registry), &[CpuReference::shared()]).unwrap();
    assert!(plan.device().is_none());
    let host = Tensor::from_fn(&[2, 3], |i| i as f32 * 0.1);
    let expected = plan.run(&[&host]).unwrap();
    let mut ws = plan.workspace().unwrap();
    let outputs = plan.run_on_device(&mut ws, &[host.view()]).unwrap();
    assert_eq!(outputs.len(), 1);
    assert!(outputs.device_buffer(0).is_none());
    assert_eq!(outputs.shape(0), Some(&[2usize, 3][..]));
    assert_eq!(outputs.to_host(0).unwrap(), expected[0]);
    assert!(matches!(outputs.to_host(1), Err(Error::NoSuchOutput { index: 1, outputs: 1 })));
}

/// A user's guard that keeps the details of every site it is prepared for.
struct KeepsDetails(Arc<std::sync::Mutex<Vec<(String, crate::core::guards::Level, ScopeDetailsOf)>>>);
type ScopeDetailsOf = Option<crate::core::guards::ScopeDetails>;

impl crate::core::guards::Guard for KeepsDetails {
    fn kind(&self) -> crate::core::guards::GuardKind {
        crate::core::guards::GuardKind::Custom("@details")
    }
    fn prepare(
        &self,
        site: &crate::core::guards::GuardSite<'_>,
    ) -> crate::Result<Box<dyn crate::core::guards::ScopedGuard>> {
        self.0.lock().unwrap().push((site.label.to_string(), site.level, site.details.cloned()));
        crate::core::guards::ClosureGuard::new(|| {}, || {}).prepare(site)
    }
}

#[test]
fn every_site_gets_the_details_of_what_it_surrounds() {
    use crate::core::guards::{Level, ScopeDetails};
    use crate::core::ir::TensorMeta;
    use crate::passes::{Decompose, Pass};
    let registry = Registry::with_builtins();
    let arena = Arena::new();
    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input(&[64, 256]).unwrap();
    let w = b.input(&[256, 128]).unwrap();
    let m = b.matmul(x, w).unwrap();
    let s = b.softmax(m).unwrap();
    let e = b.exp(s).unwrap();
    b.output(e).unwrap();
    let mut trace = b.finish().unwrap();
    let kept = Arc::new(std::sync::Mutex::new(Vec::new()));
    trace.attach_guard(crate::core::guards::Selection::All, KeepsDetails(kept.clone())).unwrap();
    trace.attach_trace_guard(KeepsDetails(kept.clone())).unwrap();
    let trace = Decompose.run(&trace, &arena).unwrap();
    let plan = Plan::compile(&trace, &[CpuReference::shared()]).unwrap();
    let kept = kept.lock().unwrap();
    let of = |label: &str, level: Level| {
        kept.iter().find(|(l, lv, _)| l == label && *lv == level).and_then(|(_, _, d)| d.clone()).unwrap()
    };
    let f32 = |shape: &[usize]| TensorMeta::f32(shape);
    let (xm, wm, out) = (f32(&[64, 256]), f32(&[256, 128]), f32(&[64, 128]));
    let n = 64 * 128;
    assert_eq!(
        of("matmul", Level::Op),
        ScopeDetails {
            plan: plan.id(),
            first_step: 0,
            steps: 1,
            ops: 1,
            inputs: vec![xm.clone(), wm.clone()],
            outputs: vec![out.clone()],
            bytes_read: 4 * (64 * 256 + 256 * 128),
            bytes_written: 4 * n,
            flops: 2 * n * 256,
        }
    );
    // Softmax became five prims (max, sub, exp, sum, div): its intermediates are neither
    // inputs nor outputs of its scope.
    assert_eq!(
        of("softmax", Level::Op),
        ScopeDetails {
            plan: plan.id(),
            first_step: 1,
            steps: 5,
            ops: 5,
            inputs: vec![out.clone()],
            outputs: vec![out.clone()],
            bytes_read: 4 * n,
            bytes_written: 4 * n,
            flops: 5 * n,
        }
    );
    let run = of("trace", Level::Trace);
    assert_eq!((run.first_step, run.steps, run.ops), (0, 7, 7));
    assert_eq!((run.inputs, run.outputs), (vec![xm, wm], vec![out]));
    assert_eq!(run.flops, 2 * n * 256 + 5 * n + n);
}

/// `exp` "on the device" for every dtype: 16-bit values arrive packed two per word.
struct DeviceExpAnyDtype;

struct PackedExp(crate::DType);

impl DeviceKernel for PackedExp {
    fn run(&self, inputs: &[&dyn DeviceBuffer], outputs: &mut [&mut dyn DeviceBuffer]) -> crate::Result<()> {
        let n = super::packing::values_in(self.0, memory(inputs[0]).len());
        let mut wide = crate::Tensor::try_zeros_of(self.0, &[n])?;
        super::packing::unpack(memory(inputs[0]), wide.data_mut());
        let results: Vec<f32> = wide.to_f32_vec().iter().map(|&v| crate::executors::math::exp(v)).collect();
        let results = crate::Tensor::new(&[n], results)?.to_dtype(self.0);
        let out = &mut outputs[0].as_any_mut().downcast_mut::<HostMemory>().expect("our buffer").0;
        let mut packed = Vec::new();
        super::packing::pack(results.data(), &mut packed);
        let len = out.len();
        out.copy_from_slice(&packed[..len]);
        Ok(())
    }
}

impl Executor for DeviceExpAnyDtype {
    fn name(&self) -> &str {
        "device_exp_any"
    }
    fn claims(&self, op: &OpView<'_>) -> bool {
        op.symbol_id() == prims::EXP
    }
    fn dtypes(&self) -> &[crate::DType] {
        &crate::DType::FLOATS
    }
    fn device(&self) -> Option<Arc<dyn Device>> {
        Some(Arc::new(HostMemoryDevice))
    }
    fn compile_device(&self, op: &OpView<'_>) -> crate::Result<Box<dyn DeviceKernel>> {
        Ok(Box::new(PackedExp(op.dtype_of(op.bound_symbol().outputs()[0]))))
    }
}

/// 16-bit values cross to a device packed two per word and back, through host inputs, device
/// tensors and outputs, and equal the CPU reference's; a device input of another dtype is a
/// typed error.
#[test]
fn sixteen_bit_values_travel_packed_to_devices_and_back() {
    use crate::core::ir::TensorMeta;
    use crate::DType;
    for dtype in [DType::BF16, DType::F16] {
        let registry = Registry::with_builtins();
        let arena = Arena::new();
        let mut b = TraceBuilder::new(&arena, &registry);
        let x = b.input_with(&TensorMeta::new(dtype, &[5])).unwrap();
        let e = b.exp(x).unwrap(); // on the device
        let n = b.neg(e).unwrap(); // on the host: a download
        let f = b.exp(n).unwrap(); // on the device again: an upload, then the output's download
        b.output(f).unwrap();
        let trace = b.finish().unwrap();
        let plan = Plan::compile(&trace, &[Arc::new(DeviceExpAnyDtype), CpuReference::shared()]).unwrap();
        let input = Tensor::new(&[5], vec![0.5, -1.0, 2.0, 0.0, 1.5]).unwrap().to_dtype(dtype);
        let expected = Plan::compile(&trace, &[CpuReference::shared()]).unwrap().run(&[&input]).unwrap();
        let got = plan.run(&[&input]).unwrap();
        assert_eq!(got, expected, "{dtype}: host input");
        let device: Arc<dyn Device> = plan.device().unwrap().clone();
        let on_device = crate::DeviceTensor::upload(&device, input.view()).unwrap();
        assert_eq!(on_device.dtype(), dtype);
        assert_eq!(on_device.to_host().unwrap(), input);
        let mut ws = plan.workspace().unwrap();
        let outputs = plan.run_on_device(&mut ws, &[crate::RunInput::from(&on_device)]).unwrap();
        assert_eq!(outputs.to_host(0).unwrap(), expected[0], "{dtype}: device input");
        let f32_on_device = crate::DeviceTensor::upload(&device, Tensor::zeros(&[5]).view()).unwrap();
        let err = plan.run_on_device(&mut ws, &[crate::RunInput::from(&f32_on_device)]).err().unwrap();
        assert_eq!(err, Error::InputDType { index: 0, expected: dtype, got: DType::F32 });
    }
}

#[test]
fn integer_tensors_move_exactly_and_float_ops_refuse_them() {
    use crate::{DType, TensorMeta};
    let (registry, arena) = (crate::Registry::with_builtins(), crate::Arena::new());
    let mut b = crate::TraceBuilder::new(&arena, &registry);
    let ids = b.input_with(&TensorMeta::new(DType::I64, &[2, 3])).unwrap();
    let t = b.transpose(ids, &[1, 0]).unwrap();
    let r = b.reshape(t, &[6]).unwrap();
    let wide = b.broadcast_to(r, &[2, 6]).unwrap();
    let f = b.cast(wide, DType::F32).unwrap();
    let narrow = b.cast(r, DType::I32).unwrap();
    b.output(wide).unwrap();
    b.output(f).unwrap();
    b.output(narrow).unwrap();
    let trace = b.finish().unwrap();
    let plan = Plan::compile(&trace, &[crate::executors::CpuReference::shared()]).unwrap();
    let big = (1i64 << 53) + 1;
    let x = crate::Tensor::from_vec(&[2, 3], vec![0, 1, 2, big, -4, 5]).unwrap();
    let out = plan.run(&[&x]).unwrap();
    let moved = [0, big, 1, -4, 2, 5];
    assert_eq!(out[0].values::<i64>().unwrap(), [moved, moved].concat());
    assert_eq!(out[1].values::<f32>().unwrap()[1], big as f32);
    assert_eq!(out[2].values::<i32>().unwrap(), &[0, 1, 1, -4, 2, 5]);
    // Float ops on integers are typed errors naming the fix.
    let mut b = crate::TraceBuilder::new(&arena, &registry);
    let ids = b.input_with(&TensorMeta::new(DType::I64, &[4])).unwrap();
    let err = b.exp(ids).unwrap_err();
    assert!(matches!(err, Error::ShapeMismatch { .. }) && err.to_string().contains("cast it first"), "{err}");
    assert!(b.add_scalar(ids, 1.0).is_err() && b.sum(ids).is_err() && b.softmax(ids).is_err());
    // A run given f32 for an i64 input is told so.
    let f = crate::Tensor::zeros(&[2, 3]);
    assert!(matches!(plan.run(&[&f]), Err(Error::InputDType { expected: DType::I64, .. })));
}

/// An executor that claims nothing and declares `emits`.
struct Declares(Vec<crate::core::plan::EmittedRange>);

impl Executor for Declares {
    fn name(&self) -> &str {
        "declares"
    }
    fn claims(&self, _op: &crate::core::plan::OpView<'_>) -> bool {
        false
    }
    fn compile(&self, op: &crate::core::plan::OpView<'_>) -> crate::Result<Box<dyn crate::core::plan::Kernel>> {
        Err(Error::NoExecutor { symbol: op.name().into(), tried: vec!["declares".into()] })
    }
    fn emits(&self) -> &[crate::core::plan::EmittedRange] {
        &self.0
    }
}

/// Declarations in `Executor::emits` that the runtime does not use are plan notes naming the
/// executor, the declaration and the fix; the ones it uses are not.
#[test]
fn unused_emission_declarations_are_plan_notes() {
    use crate::core::guards::{GuardKind, Level};
    use crate::core::plan::EmittedRange;
    let (arena, registry) = (Arena::new(), Registry::with_builtins());
    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input(&[2]).unwrap();
    let y = b.exp(x).unwrap();
    b.output(y).unwrap();
    let trace = b.finish().unwrap();
    let notes = |emits: Vec<EmittedRange>| {
        let executors: [Arc<dyn Executor>; 2] = [Arc::new(Declares(emits)), CpuReference::shared()];
        Plan::compile(&trace, &executors).unwrap().notes().to_vec()
    };
    let used = vec![EmittedRange::nvtx_regions("fuser"), EmittedRange::nvtx_ops("kernels")];
    assert_eq!(notes(used), Vec::<String>::new());
    let unused = vec![
        EmittedRange::nvtx_ops("kernels"),
        EmittedRange::nvtx_ops("again"),
        EmittedRange { kind: GuardKind::NvtxRange, level: Level::Trace, domain: "runs".into() },
        EmittedRange { kind: GuardKind::Custom("@timer"), level: Level::Op, domain: "".into() },
    ];
    let found = notes(unused);
    assert_eq!(found.len(), 3, "{found:#?}");
    assert!(found[0].contains("`declares`") && found[0].contains("`kernels`") && found[0].contains("`again`"));
    assert!(found[1].contains("`trace` level") && found[1].contains("remove it"), "{}", found[1]);
    assert!(found[2].contains("@timer") && found[2].contains("changes nothing"), "{}", found[2]);
}

#[test]
fn uploads_of_inputs_given_on_the_device_hold_no_memory() {
    let (registry, arena) = (Registry::with_builtins(), Arena::new());
    let trace = exp_twice(&arena, &registry);
    let plan = Plan::compile(&trace, &[Arc::new(DeviceExp), CpuReference::shared()]).unwrap();
    GUARDED.with(|g| g.set(1));
    let host = Tensor::from_fn(&[2, 3], |i| i as f32 * 0.1);
    let expected = Plan::compile(&trace, &[CpuReference::shared()]).unwrap().run(&[&host]).unwrap();
    // Three buffers of six words: x's upload, e, f.
    let word = std::mem::size_of::<f32>();
    assert_eq!(plan.device_bytes(), 3 * 6 * word);
    let mut ws = plan.workspace().unwrap();
    assert_eq!(ws.device_bytes(), 0, "nothing before the first run");
    let on_device = DeviceTensor::upload(plan.device().unwrap(), host.view()).unwrap();
    let got = plan.run_on_device(&mut ws, &[RunInput::from(&on_device)]).unwrap().to_host(0).unwrap();
    assert_eq!(got, expected[0]);
    assert_eq!(ws.device_bytes(), 2 * 6 * word, "x is read where it is: no upload buffer");
    // A run that gives x on the host makes its upload buffer, and later runs keep it.
    let got = plan.run_on_device(&mut ws, &[host.view()]).unwrap().to_host(0).unwrap();
    assert_eq!(got, expected[0]);
    assert_eq!(ws.device_bytes(), plan.device_bytes());
    let got = plan.run_on_device(&mut ws, &[RunInput::from(&on_device)]).unwrap().to_host(0).unwrap();
    assert_eq!(got, expected[0]);
    assert_eq!(ws.device_bytes(), plan.device_bytes());
    GUARDED.with(|g| g.set(0));
}

/// Runs `add` "on the device"; its kernel writes an in-place update over the input it updates
/// when the op asks for it (`OpView::in_place_updates`) and the executor agrees.
struct DeviceAdd {
    in_place: bool,
}

struct AddOnDevice(smallvec::SmallVec<[(usize, usize); 4]>);

impl DeviceKernel for AddOnDevice {
    fn run(&self, inputs: &[&dyn DeviceBuffer], outputs: &mut [&mut dyn DeviceBuffer]) -> crate::Result<()> {
        let out = &mut outputs[0].as_any_mut().downcast_mut::<HostMemory>().expect("our buffer").0;
        // An empty input is the one the output is written over: its value is in the output.
        let read = |k: usize, out: &[f32]| if inputs[k].is_empty() { out.to_vec() } else { memory(inputs[k]).to_vec() };
        let (a, b) = (read(0, out), read(1, out));
        for (o, (a, b)) in out.iter_mut().zip(a.iter().zip(&b)) {
            *o = a + b;
        }
        Ok(())
    }
    fn in_place(&self, input: usize, output: usize) -> bool {
        self.0.contains(&(input, output))
    }
}

impl Executor for DeviceAdd {
    fn name(&self) -> &str {
        "device_add"
    }
    fn claims(&self, op: &OpView<'_>) -> bool {
        // `exp` fails and `neg` panics, for the error paths; `reshape` is a view.
        matches!(op.symbol_id(), prims::ADD | prims::EXP | prims::NEG | prims::RESHAPE)
    }
    fn device(&self) -> Option<Arc<dyn Device>> {
        Some(Arc::new(HostMemoryDevice))
    }
    fn compile_device(&self, op: &OpView<'_>) -> crate::Result<Box<dyn DeviceKernel>> {
        match op.symbol_id() {
            prims::EXP => Ok(Box::new(Failing { panics: false })),
            prims::NEG => Ok(Box::new(Failing { panics: true })),
            _ => Ok(Box::new(AddOnDevice(if self.in_place { op.in_place_updates() } else { Default::default() }))),
        }
    }
}

/// A kernel that fails, or panics.
struct Failing {
    panics: bool,
}

impl DeviceKernel for Failing {
    fn run(&self, _: &[&dyn DeviceBuffer], _: &mut [&mut dyn DeviceBuffer]) -> crate::Result<()> {
        assert!(!self.panics, "a kernel that panics");
        Err(Error::Execution { executor: "device_add".into(), symbol: "exp".into(), message: "it fails".into() })
    }
}

#[test]
fn lent_inputs_get_their_memory_back_when_a_later_step_fails_or_panics() {
    let (w0, g) = (Tensor::from_fn(&[2, 3], |i| i as f32), Tensor::from_fn(&[2, 3], |i| 0.5 * i as f32 + 1.0));
    let sum = Tensor::from_fn(&[2, 3], |i| w0.to_f32_vec()[i] + g.to_f32_vec()[i]);
    for panics in [false, true] {
        let (arena, registry) = (Arena::new(), Registry::with_builtins());
        let mut b = TraceBuilder::new(&arena, &registry);
        let (w, gv) = (b.input(&[2, 3]).unwrap(), b.input(&[2, 3]).unwrap());
        let updated = b.add(w, gv).unwrap();
        b.update(w, updated).unwrap();
        let after = if panics { b.neg(gv).unwrap() } else { b.exp(gv).unwrap() };
        b.output(after).unwrap();
        let trace = b.finish().unwrap();
        let plan = Plan::compile(&trace, &[Arc::new(DeviceAdd { in_place: true })]).unwrap();
        let device = plan.device().unwrap().clone();
        let mut w_on = DeviceTensor::upload(&device, w0.view()).unwrap();
        let mut g_on = DeviceTensor::upload(&device, g.view()).unwrap();
        let mut ws = plan.workspace().unwrap();
        let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut refs = [RunInputMut::from(&mut w_on), RunInputMut::from(&mut g_on)];
            plan.run_updating_on_device(&mut ws, &mut refs).map(drop)
        }));
        match run {
            Ok(result) => assert!(!panics && matches!(result, Err(Error::Execution { .. }))),
            Err(_) => assert!(panics),
        }
        // Its memory back, holding the update written before the failure (as documented).
        assert_eq!(w_on.buffer().len(), 6);
        assert_eq!(w_on.to_host().unwrap(), sum);
        assert_eq!(g_on.to_host().unwrap(), g);
    }
}

#[test]
fn a_view_of_the_input_read_after_its_update_keeps_the_update_apart() {
    let (arena, registry) = (Arena::new(), Registry::with_builtins());
    let mut b = TraceBuilder::new(&arena, &registry);
    let (w, g) = (b.input(&[2, 3]).unwrap(), b.input(&[2, 3]).unwrap());
    let view = b.reshape(w, &[3, 2]).unwrap();
    let updated = b.add(w, g).unwrap();
    b.update(w, updated).unwrap();
    let back = b.reshape(view, &[2, 3]).unwrap();
    let later = b.add(back, g).unwrap(); // reads w (through its views) after the update
    b.output(later).unwrap();
    let trace = b.finish().unwrap();
    let plan = Plan::compile(&trace, &[Arc::new(DeviceAdd { in_place: true }), CpuReference::shared()]).unwrap();
    // Uploads of w and g, the update, and the later sum: no merge.
    assert_eq!(plan.device_bytes(), 4 * 6 * std::mem::size_of::<f32>(), "{plan}");
    let (w0, g0) = (Tensor::from_fn(&[2, 3], |i| i as f32), Tensor::from_fn(&[2, 3], |i| 0.5 * i as f32 + 1.0));
    let sum = Tensor::from_fn(&[2, 3], |i| w0.to_f32_vec()[i] + g0.to_f32_vec()[i]);
    let device = plan.device().unwrap().clone();
    let mut w_on = DeviceTensor::upload(&device, w0.view()).unwrap();
    let mut g_on = DeviceTensor::upload(&device, g0.view()).unwrap();
    let mut ws = plan.workspace().unwrap();
    let mut refs = [RunInputMut::from(&mut w_on), RunInputMut::from(&mut g_on)];
    let outputs = plan.run_updating_on_device(&mut ws, &mut refs).unwrap();
    // (Output 0 is the update, written back into w.)
    assert_eq!(outputs.to_host(1).unwrap(), sum, "the later sum read w as it was");
    assert_eq!(w_on.to_host().unwrap(), sum);
}

/// `w += g` declared as an update of `w`, and `y = w + g` returned as well.
fn update_trace<'a>(arena: &'a Arena, registry: &'a Registry, read_after: bool) -> crate::Trace<'a> {
    let mut b = TraceBuilder::new(arena, registry);
    let (w, g) = (b.input(&[2, 3]).unwrap(), b.input(&[2, 3]).unwrap());
    let updated = b.add(w, g).unwrap();
    b.update(w, updated).unwrap();
    if read_after {
        // w read after its update is computed: the update cannot be written over it.
        let again = b.add(w, w).unwrap();
        b.output(again).unwrap();
    }
    b.finish().unwrap()
}

#[test]
fn updates_are_written_over_the_inputs_they_update() {
    let (arena, registry) = (Arena::new(), Registry::with_builtins());
    let trace = update_trace(&arena, &registry, false);
    let plan = Plan::compile(&trace, &[Arc::new(DeviceAdd { in_place: true }), CpuReference::shared()]).unwrap();
    let word = std::mem::size_of::<f32>();
    // The uploads of w and g; the update shares w's.
    assert_eq!(plan.device_bytes(), 2 * 6 * word, "{plan}");
    let listing = plan.to_string();
    assert!(listing.contains("# device memory on `host-memory`: 48 bytes per workspace"), "{listing}");
    assert!(listing.contains("device_add, writes output 0 over input 0 (in place)"), "{listing}");
    let (w0, g) = (Tensor::from_fn(&[2, 3], |i| i as f32), Tensor::from_fn(&[2, 3], |i| 0.5 * i as f32 + 1.0));
    let sum = |w: &Tensor| Tensor::from_fn(&[2, 3], |i| w.to_f32_vec()[i] + g.to_f32_vec()[i]);
    let device = plan.device().unwrap().clone();
    let mut ws = plan.workspace().unwrap();
    // Updating on the device: the caller's memory is lent for the run and holds the update.
    let mut w = DeviceTensor::upload(&device, w0.view()).unwrap();
    let mut g_on = DeviceTensor::upload(&device, g.view()).unwrap();
    let mut expected = w0.clone();
    for _ in 0..3 {
        let mut refs = [RunInputMut::from(&mut w), RunInputMut::from(&mut g_on)];
        let outputs = plan.run_updating_on_device(&mut ws, &mut refs).unwrap();
        assert!(outputs.device_buffer(0).is_none(), "the update is the input's now");
        assert!(outputs.to_host(0).is_err());
        expected = sum(&expected);
        assert_eq!(w.to_host().unwrap(), expected);
        assert_eq!(w.buffer().len(), 6);
        assert_eq!(ws.device_bytes(), 0, "every input is read and written where it is");
    }
    // A run that does not update leaves the caller's tensor as it was: it writes over a copy.
    let outputs = plan.run_on_device(&mut ws, &[RunInput::from(&w), RunInput::from(&g_on)]).unwrap();
    assert_eq!(outputs.to_host(0).unwrap(), sum(&expected));
    assert_eq!(w.to_host().unwrap(), expected);
    assert_eq!(ws.device_bytes(), 6 * word, "the copy of w");
    // Given on the host, as before: uploaded, updated over the upload, written back.
    let mut w_host = w0.clone();
    let mut refs = [RunInputMut::Host(&mut w_host), RunInputMut::from(&mut g_on)];
    plan.run_updating_on_device(&mut ws, &mut refs).unwrap();
    assert_eq!(w_host, sum(&w0));
    let mut w_host = w0.clone();
    let mut g_host = g.clone();
    plan.run_updating(&mut ws, &mut [&mut w_host, &mut g_host]).unwrap();
    assert_eq!(w_host, sum(&w0));
    // And updating on the device again, after the workspace's buffer was made.
    let mut refs = [RunInputMut::from(&mut w), RunInputMut::from(&mut g_on)];
    plan.run_updating_on_device(&mut ws, &mut refs).unwrap();
    assert_eq!(w.to_host().unwrap(), sum(&expected));
}

#[test]
fn updates_that_cannot_be_written_over_their_input_keep_a_buffer() {
    let (arena, registry) = (Arena::new(), Registry::with_builtins());
    let word = std::mem::size_of::<f32>();
    let (w0, g) = (Tensor::from_fn(&[2, 3], |i| i as f32), Tensor::from_fn(&[2, 3], |i| 0.5 * i as f32 + 1.0));
    let sum = Tensor::from_fn(&[2, 3], |i| w0.to_f32_vec()[i] + g.to_f32_vec()[i]);
    for (read_after, kernel_agrees) in [(true, true), (false, false)] {
        let trace = update_trace(&arena, &registry, read_after);
        let add = Arc::new(DeviceAdd { in_place: kernel_agrees });
        let plan = Plan::compile(&trace, &[add, CpuReference::shared()]).unwrap();
        // The uploads, the update, and (read after) w + w.
        let buffers = if read_after { 4 } else { 3 };
        assert_eq!(plan.device_bytes(), buffers * 6 * word, "{plan}");
        let device = plan.device().unwrap().clone();
        let mut w = DeviceTensor::upload(&device, w0.view()).unwrap();
        let mut g_on = DeviceTensor::upload(&device, g.view()).unwrap();
        let mut ws = plan.workspace().unwrap();
        let mut refs = [RunInputMut::from(&mut w), RunInputMut::from(&mut g_on)];
        let outputs = plan.run_updating_on_device(&mut ws, &mut refs).unwrap();
        if read_after {
            let doubled = Tensor::from_fn(&[2, 3], |i| 2.0 * w0.to_f32_vec()[i]);
            assert_eq!(outputs.to_host(1).unwrap(), doubled, "w + w reads w as it was");
        }
        assert_eq!(w.to_host().unwrap(), sum);
    }
}

#[test]
fn device_values_share_buffers_when_their_lifetimes_do_not_overlap() {
    let registry = Registry::with_builtins();
    let arena = Arena::new();
    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input(&[2, 3]).unwrap();
    let mut chain = vec![x];
    for _ in 0..6 {
        let last = *chain.last().unwrap();
        chain.push(b.exp(last).unwrap());
    }
    // The third and the sixth are outputs: each keeps a buffer of its own.
    b.output(chain[3]).unwrap();
    b.output(chain[6]).unwrap();
    let mut trace = b.finish().unwrap();
    attach_guarded(&mut trace); // the test kernel checks that it runs inside a guard
    let plan = Plan::compile(&trace, &[Arc::new(DeviceExp), CpuReference::shared()]).unwrap();
    // The upload of x and the two outputs keep their own; exp 1, 2, 4 and 5 share two buffers
    // (a step's outputs never take the buffer of one of its inputs): 5 buffers, not 7.
    assert_eq!(plan.device_bytes(), 5 * 6 * std::mem::size_of::<f32>());
    let reference = Plan::compile(&trace, &[CpuReference::shared()]).unwrap();
    let input = Tensor::from_fn(&[2, 3], |i| 0.05 * i as f32 - 0.1);
    let mut ws = plan.workspace().unwrap();
    for _ in 0..2 {
        let out = plan.run_with(&mut ws, &[&input]).unwrap();
        let expected = reference.run(&[&input]).unwrap();
        assert_eq!(out.get(0).unwrap().to_tensor(), expected[0]);
        assert_eq!(out.get(1).unwrap().to_tensor(), expected[1]);
    }
}

/// Runs `exp` and `reshape` "on the device", counting the reshape kernels it is asked for.
struct DeviceExpAndReshape(std::sync::atomic::AtomicUsize);

struct CopyOnDevice;

impl DeviceKernel for CopyOnDevice {
    fn run(&self, inputs: &[&dyn DeviceBuffer], outputs: &mut [&mut dyn DeviceBuffer]) -> crate::Result<()> {
        let x = memory(inputs[0]).to_vec();
        outputs[0].as_any_mut().downcast_mut::<HostMemory>().expect("our buffer").0.copy_from_slice(&x);
        Ok(())
    }
}

impl Executor for DeviceExpAndReshape {
    fn name(&self) -> &str {
        "device_exp_reshape"
    }
    fn claims(&self, op: &OpView<'_>) -> bool {
        op.symbol_id() == prims::EXP || op.symbol_id() == prims::RESHAPE
    }
    fn device(&self) -> Option<Arc<dyn Device>> {
        Some(Arc::new(HostMemoryDevice))
    }
    fn compile_device(&self, op: &OpView<'_>) -> crate::Result<Box<dyn DeviceKernel>> {
        if op.symbol_id() == prims::RESHAPE {
            self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return Ok(Box::new(CopyOnDevice));
        }
        Ok(Box::new(ExpOnDevice))
    }
}

#[test]
fn reshapes_on_the_device_are_views_of_their_input() {
    let registry = Registry::with_builtins();
    let arena = Arena::new();
    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input(&[2, 3]).unwrap();
    let e = b.exp(x).unwrap();
    let r = b.reshape(e, &[3, 2]).unwrap(); // a view of e
    let f = b.exp(r).unwrap();
    let out = b.reshape(f, &[6]).unwrap(); // an output: a copy of its own
    b.output(out).unwrap();
    let mut trace = b.finish().unwrap();
    attach_guarded(&mut trace);
    let recorder = crate::guards::Recorder::new();
    trace.attach_guard(crate::guards::Selection::All, recorder.clone()).unwrap();
    let executor = Arc::new(DeviceExpAndReshape(Default::default()));
    let plan = Plan::compile(&trace, &[executor.clone(), CpuReference::shared()]).unwrap();
    assert_eq!(executor.0.load(std::sync::atomic::Ordering::Relaxed), 1, "only the output's reshape copies");
    assert_eq!(plan.to_string().matches("(a view: no copy)").count(), 1, "{plan}");
    let input = Tensor::from_fn(&[2, 3], |i| 0.1 * i as f32);
    let expected = Plan::compile(&trace, &[CpuReference::shared()]).unwrap().run(&[&input]).unwrap();
    recorder.clear();
    assert_eq!(plan.run(&[&input]).unwrap(), expected);
    // The view's guards still run around its (empty) step: a range for each reshape.
    let reshapes = recorder.ranges().iter().filter(|r| &*r.label == "reshape").count();
    assert_eq!(reshapes, 2, "{:?}", recorder.ranges());
}

/// A user's device executor whose `relu` of positive values is a view of its input
/// (`Executor::output_views`): the output shares the input's buffer and the kernel runs with no
/// output buffer; where the output is an output of the trace it gets a buffer of its own.
#[test]
fn an_output_an_executor_calls_a_view_shares_its_inputs_buffer() {
    struct Views;
    /// `relu` of positive values: nothing to do as a view, a copy otherwise.
    struct ReluOfPositive;
    /// `neg` on the "device".
    struct Neg;
    impl DeviceKernel for ReluOfPositive {
        fn run(&self, inputs: &[&dyn DeviceBuffer], outputs: &mut [&mut dyn DeviceBuffer]) -> crate::Result<()> {
            if let Some(out) = outputs.first_mut() {
                let x = memory(inputs[0]).to_vec();
                out.as_any_mut().downcast_mut::<HostMemory>().expect("our buffer").0[..x.len()].copy_from_slice(&x);
            }
            VIEW_RUNS.with(|r| r.set(r.get() + usize::from(outputs.is_empty())));
            Ok(())
        }
    }
    impl DeviceKernel for Neg {
        fn run(&self, inputs: &[&dyn DeviceBuffer], outputs: &mut [&mut dyn DeviceBuffer]) -> crate::Result<()> {
            let x = memory(inputs[0]).to_vec();
            let out = &mut outputs[0].as_any_mut().downcast_mut::<HostMemory>().expect("our buffer").0;
            for (o, v) in out.iter_mut().zip(x) {
                *o = -v;
            }
            Ok(())
        }
    }
    thread_local! {
        static VIEW_RUNS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    }
    impl Executor for Views {
        fn name(&self) -> &str {
            "views"
        }
        fn claims(&self, op: &OpView<'_>) -> bool {
            op.symbol_id() == prims::RELU || op.symbol_id() == prims::NEG
        }
        fn device(&self) -> Option<Arc<dyn Device>> {
            Some(Arc::new(HostMemoryDevice))
        }
        fn compile_device(&self, op: &OpView<'_>) -> crate::Result<Box<dyn DeviceKernel>> {
            Ok(if op.symbol_id() == prims::RELU { Box::new(ReluOfPositive) } else { Box::new(Neg) })
        }
        fn output_views(&self, op: &OpView<'_>) -> Option<usize> {
            (op.symbol_id() == prims::RELU).then_some(0)
        }
    }
    let registry = Registry::with_builtins();
    let arena = Arena::new();
    let views: Arc<dyn Executor> = Arc::new(Views);
    let x = Tensor::from_fn(&[2, 3], |i| i as f32 + 1.0);
    for relu_is_output in [false, true] {
        let mut b = TraceBuilder::new(&arena, &registry);
        let input = b.input(&[2, 3]).unwrap();
        let a = b.relu(input).unwrap();
        let y = b.neg(a).unwrap();
        b.output(y).unwrap();
        if relu_is_output {
            b.output(a).unwrap();
        }
        let plan = Plan::compile(&b.finish().unwrap(), std::slice::from_ref(&views)).unwrap();
        VIEW_RUNS.with(|r| r.set(0));
        let out = plan.run(&[&x]).unwrap();
        assert_eq!(out[0].to_f32_vec(), x.to_f32_vec().iter().map(|v| -v).collect::<Vec<_>>());
        if relu_is_output {
            assert_eq!(out[1].to_f32_vec(), x.to_f32_vec());
        }
        assert_eq!(VIEW_RUNS.with(|r| r.get()), usize::from(!relu_is_output), "relu as output: {relu_is_output}");
    }
}

/// A user's kernel that is also a [`MapKernel`]: the run loop calls its map where the step's
/// inputs and output are `f32` of one length, and its `run` everywhere else (a broadcast, a
/// 16-bit dtype), whatever `as_map` says.
#[test]
fn the_run_loop_calls_a_kernels_map_where_its_values_are_f32_of_one_length() {
    use crate::core::ir::{DType, TensorMeta};
    use crate::core::tensor::{TensorMut, TensorRef};
    thread_local! {
        static CALLS: std::cell::Cell<(usize, usize)> = const { std::cell::Cell::new((0, 0)) };
    }
    /// `mul`, counting its calls: (runs, maps).
    struct CountingMul(Box<dyn Kernel>);
    impl Kernel for CountingMul {
        fn run(&self, inputs: &[TensorRef<'_>], outputs: &mut [TensorMut<'_>]) -> crate::Result<()> {
            CALLS.with(|c| c.set((c.get().0 + 1, c.get().1)));
            self.0.run(inputs, outputs)
        }
        fn as_map(&self) -> Option<&dyn MapKernel> {
            Some(self)
        }
    }
    impl MapKernel for CountingMul {
        fn map(&self, inputs: &[&[f32]], out: &mut [f32]) {
            CALLS.with(|c| c.set((c.get().0, c.get().1 + 1)));
            for ((o, a), b) in out.iter_mut().zip(inputs[0]).zip(inputs[1]) {
                *o = a * b;
            }
        }
    }
    struct Mul;
    impl Executor for Mul {
        fn name(&self) -> &str {
            "counting-mul"
        }
        fn claims(&self, op: &OpView<'_>) -> bool {
            op.symbol_id() == prims::MUL
        }
        fn dtypes(&self) -> &[DType] {
            &[DType::F32, DType::BF16]
        }
        fn compile(&self, op: &OpView<'_>) -> crate::Result<Box<dyn Kernel>> {
            Ok(Box::new(CountingMul(CpuReference::new().compile(op)?)))
        }
    }
    let registry = Registry::with_builtins();
    let arena = Arena::new();
    let executors: [Arc<dyn Executor>; 2] = [Arc::new(Mul), CpuReference::shared()];
    // (second operand's shape, dtype, whether the map runs)
    for (shape, dtype, mapped) in
        [(&[2, 3][..], DType::F32, true), (&[3][..], DType::F32, false), (&[2, 3][..], DType::BF16, false)]
    {
        let mut b = TraceBuilder::new(&arena, &registry);
        let x = b.input_with(&TensorMeta::new(dtype, &[2, 3])).unwrap();
        let y = b.input_with(&TensorMeta::new(dtype, shape)).unwrap();
        // (`neg` on the CPU reference: the map reads a workspace buffer and an input.)
        let x = b.neg(x).unwrap();
        let z = b.mul(x, y).unwrap();
        b.output(z).unwrap();
        let trace = b.finish().unwrap();
        let plan = Plan::compile(&trace, &executors).unwrap();
        let reference = Plan::compile(&trace, &[CpuReference::shared()]).unwrap();
        let xs = Tensor::from_fn(&[2, 3], |i| i as f32 + 1.0).to_dtype(dtype);
        let ys = Tensor::from_fn(shape, |i| 2.0 - i as f32).to_dtype(dtype);
        CALLS.with(|c| c.set((0, 0)));
        let out = plan.run(&[&xs, &ys]).unwrap();
        assert_eq!(CALLS.with(|c| c.get()), if mapped { (0, 1) } else { (1, 0) }, "{shape:?} {dtype}");
        assert_eq!(out[0].to_f32_vec(), reference.run(&[&xs, &ys]).unwrap()[0].to_f32_vec(), "{shape:?} {dtype}");
    }
}

/// Runs `exp` (as the reference does) under its own name, declaring an option of a family
/// that several executors share (as `cuda.*` is both CUDA executors'), configured with `knob`.
struct SharesAnOption {
    name: &'static str,
    knob: bool,
}

const SHARED_OPTION: &[crate::options::OptionSpec] = &[crate::options::OptionSpec {
    name: "family.knob",
    ty: crate::options::OptionType::Bool,
    default: crate::options::OptionValue::Bool(false),
    doc: "A knob two executors read.",
    audience: crate::options::Audience::Developer,
    env: None,
}];

impl Executor for SharesAnOption {
    fn name(&self) -> &str {
        self.name
    }
    fn claims(&self, op: &OpView<'_>) -> bool {
        op.symbol_id() == prims::EXP
    }
    fn compile(&self, op: &OpView<'_>) -> crate::Result<Box<dyn Kernel>> {
        CpuReference::new().compile(op)
    }
    fn options(&self) -> &[crate::options::OptionSpec] {
        SHARED_OPTION
    }
    fn configured_options(&self) -> Vec<(&'static str, crate::options::OptionValue)> {
        vec![("family.knob", crate::options::OptionValue::Bool(self.knob))]
    }
}

/// An option is in force where an executor that declares it runs steps configured with its
/// value, whatever the executor's name: the header lists it, and it is not reported unused.
#[test]
fn options_that_several_executors_declare_are_in_force_where_one_runs_steps() {
    let registry = Registry::with_builtins();
    let arena = Arena::new();
    let trace = exp_then_add(&arena, &registry);
    let mut options = crate::options::Options::runtime_only();
    options.declare(SHARED_OPTION).unwrap();
    options.set_developer("family.knob", true).unwrap();
    let runs = |knob: bool| -> Arc<dyn Executor> { Arc::new(SharesAnOption { name: "first_of_family", knob }) };
    let idle: Arc<dyn Executor> = Arc::new(SharesAnOption { name: "second_of_family", knob: false });
    let executors = [runs(true), idle.clone(), CpuReference::shared()];
    let plan = Plan::compile_with_options(&trace, &executors, &options).unwrap();
    assert!(plan.unused_options().is_empty(), "{:?}", plan.unused_options());
    assert_eq!(plan.developer_options(), ["family.knob=true".to_string()]);
    // Configured otherwise, or declared only by an executor that runs nothing: unused.
    for executors in
        [[runs(false), idle.clone(), CpuReference::shared()], [idle.clone(), runs(true), CpuReference::shared()]]
    {
        let plan = Plan::compile_with_options(&trace, &executors, &options).unwrap();
        assert_eq!(plan.unused_options(), ["family.knob".to_string()], "{plan}");
    }
}
