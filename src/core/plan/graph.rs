//! Graphs: a plan's run captured once on its device and replayed as one launch.
//!
//! A replay costs one launch on the host, whatever the number of steps, so it suits small,
//! latency-bound plans run many times on the same device memory (weights bound on the device,
//! activations refilled in place with [`DeviceTensor::copy_from_host`] through
//! [`PlanGraph::input_mut`]). What a replay runs is what the capture recorded: the device work
//! of every step, on the same device memory; the graph borrows its input tensors, so none can
//! be dropped or replaced while it lives. Host code does not replay, so per-op, per-region
//! and per-scope guards (NVTX ranges, recorders, timers; the ranges of named scopes such as
//! `h.3.attn` too) do not run in replays; the plan's run-level guards (those attached with
//! `attach_trace_guard`) surround each replay, and [`PlanGraph::range_map`] lists the ranges a
//! replay pushes. Profile in stream mode ([`Plan::run_on_device`]) to see each op and module.

use super::compile::{Plan, Work};
use super::device::DeviceGraph;
use super::executor::RunDecision;
use super::guard_schedule::GuardStack;
use super::range_map::RangeMap;
use super::workspace::{DeviceOutputs, OnQueue, Workspace};
use super::{DeviceTensor, RunInput};
use crate::core::guards::Level;
use crate::error::{Error, Result};

/// A plan's run captured as a device graph, with the workspace and the device tensors it
/// captured as inputs (borrowed for as long as it lives). Made by [`Plan::capture`].
pub struct PlanGraph<'w> {
    plan: &'w Plan,
    workspace: &'w mut Workspace,
    graph: Box<dyn DeviceGraph>,
    inputs: Vec<&'w mut DeviceTensor>,
    /// The buffer each input held when captured ([`DeviceTensor::buffer_identity`]): a replay
    /// reads that memory, so it refuses to run once an input holds another.
    captured: Vec<u64>,
}

impl Plan {
    /// Captures one run of this plan on its device as a graph, replayed by
    /// [`PlanGraph::replay`] as one launch. Every step must run on the device and every input
    /// be a device tensor; the graph borrows them (a replay reads the memory it captured), and
    /// new data reaches them through [`PlanGraph::input_mut`]. The run is made once first,
    /// uncaptured, so that kernels are loaded and buffers allocated.
    ///
    /// Capturing records the work this thread queues on the workspace's own queue (a CUDA
    /// stream); other threads' runs go to their own workspaces' queues and are not recorded.
    ///
    /// ```no_run
    /// # // Needs a GPU: `proptests/cuda_matches_reference.rs` runs the tested version.
    /// # #[cfg(feature = "cuda")] {
    /// use std::sync::Arc;
    /// use boundscope::executors::cuda::{CudaDevice, CudaOps};
    /// use boundscope::{Arena, Device, DeviceTensor, Plan, Registry, Tensor, TraceBuilder};
    /// let gpu = CudaDevice::new()?;
    /// let registry = Registry::with_builtins();
    /// let arena = Arena::new();
    /// let mut b = TraceBuilder::new(&arena, &registry);
    /// let x = b.input(&[256])?;
    /// let y = b.tanh(x)?;
    /// b.output(y)?;
    /// let plan = Plan::compile(&b.finish()?, &[Arc::new(CudaOps::new(gpu.clone()))])?;
    /// let device: Arc<dyn Device> = gpu;
    /// let mut x = DeviceTensor::upload(&device, Tensor::zeros(&[256]).view())?;
    /// let mut workspace = plan.workspace()?;
    /// let mut graph = plan.capture(&mut workspace, vec![&mut x])?;
    /// for step in 0..3 {
    ///     graph.input_mut(0).unwrap().copy_from_host(Tensor::from_fn(&[256], |i| (i + step) as f32).view())?;
    ///     let y = graph.replay()?.to_host(0)?; // one launch, then one download
    ///     assert_eq!(y.to_f32_vec()[0], (step as f32).tanh());
    /// }
    /// # }
    /// # Ok::<(), boundscope::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::GraphUnsupported`] for a plan with host steps, a device that cannot capture, or
    /// a workspace made by [`workspace_on_device_queue`](Self::workspace_on_device_queue); the
    /// errors of [`run_on_device`](Self::run_on_device).
    pub fn capture<'w>(
        &'w self,
        workspace: &'w mut Workspace,
        inputs: Vec<&'w mut DeviceTensor>,
    ) -> Result<PlanGraph<'w>> {
        let unsupported = |reason: String| Err(Error::GraphUnsupported { reason });
        let Some(device) = self.device.clone() else {
            return unsupported("this plan has no device steps; compile it with device executors".into());
        };
        if workspace.on_device_queue {
            return unsupported(
                "the workspace runs on the device's own queue (`Plan::workspace_on_device_queue`), where other \
                 threads' transfers would join the graph: capture a workspace made by `Plan::workspace`"
                    .into(),
            );
        }
        if !self.updates.is_empty() {
            return unsupported(
                "the plan updates inputs in place (`TraceBuilder::update`), which a replay would not write back; \
                 run it with `Plan::run_updating_on_device`"
                    .into(),
            );
        }
        if let Some(&i) = self.checked_steps.first() {
            return unsupported(format!(
                "step {i} (`{}`) checks its inputs on the device after each run (ids against their table), \
                 which a replay cannot report; run the plan as stream runs (`Plan::run_on_device`)",
                self.steps[i].line
            ));
        }
        for (i, step) in self.steps.iter().enumerate() {
            let replayable = match step.work {
                Work::Device(_) | Work::Upload => true,
                Work::Download => self.device_io.output_download[i],
                Work::Host(_) => false,
            };
            if !replayable {
                return unsupported(format!(
                    "step {i} (`{}`) runs on the host or moves data to it; a graph replays device work only",
                    step.line
                ));
            }
        }
        let graph = {
            let run_inputs: Vec<RunInput<'_>> = inputs.iter().map(|t| RunInput::Device(t)).collect();
            // Uncaptured first: kernels loaded, buffers, the workspace's queue and library
            // handles allocated.
            self.run_on_device(workspace, &run_inputs)?;
            device.synchronize()?;
            // Recorded on the workspace's queue, which replays then go to.
            let queue = workspace.queue.take();
            let on_queue = OnQueue::enter(Some(&*device), queue.as_deref());
            let graph = on_queue.and_then(|_on_queue| {
                device.begin_capture()?;
                let capturing = Capturing { device: &*device, open: true };
                let captured = self.run_placed(workspace, &run_inputs, true, |plan, workspace, run| {
                    plan.check_inputs(run)?;
                    // Host-side code does not replay: record no region ranges either.
                    let _decision = RunDecision::enter(false);
                    // In flight, as a run is: a kernel that panics leaves the workspace to be
                    // rebuilt by its next run, not short of the buffers its steps had taken.
                    workspace.in_flight = true;
                    let result = plan.run_unguarded(workspace, run);
                    workspace.in_flight = false;
                    result
                });
                let graph = capturing.end();
                captured?;
                graph
            });
            workspace.queue = queue;
            graph?
        };
        let captured = inputs.iter().map(|t| t.buffer_identity()).collect();
        Ok(PlanGraph { plan: self, workspace, graph, inputs, captured })
    }
}

/// A capture in progress: ended when dropped (a kernel that panicked mid-capture), so that the
/// device's stream never stays capturing.
struct Capturing<'d> {
    device: &'d dyn super::Device,
    open: bool,
}

impl Capturing<'_> {
    fn end(mut self) -> Result<Box<dyn DeviceGraph>> {
        self.open = false;
        self.device.end_capture()
    }
}

impl Drop for Capturing<'_> {
    fn drop(&mut self) {
        if self.open {
            drop(self.device.end_capture());
        }
    }
}

impl PlanGraph<'_> {
    /// Queues one replay of the captured run, on the data its input tensors hold now, inside
    /// the plan's run-level guards, and returns its outputs on the device (as
    /// [`Plan::run_on_device`] does).
    ///
    /// # Errors
    /// [`Error::GraphUnsupported`] for an input tensor replaced (assigned or swapped through
    /// [`input_mut`](Self::input_mut)) since the capture, whose memory the replay would read
    /// (refill it in place with [`DeviceTensor::copy_from_host`], or capture again); the
    /// device's launch error.
    pub fn replay(&mut self) -> Result<DeviceOutputs<'_>> {
        let replaced = self.inputs.iter().zip(&self.captured).position(|(t, &id)| t.buffer_identity() != id);
        if let Some(i) = replaced {
            return Err(Error::GraphUnsupported {
                reason: format!(
                    "input {i} holds another buffer than the one captured (it was replaced or swapped through \
                     `PlanGraph::input_mut`), and a replay reads the captured memory; refill it in place with \
                     `DeviceTensor::copy_from_host`, or capture the plan again"
                ),
            });
        }
        let plan = self.plan;
        let schedule = &plan.schedules[if plan.profiling() { 0 } else { 1 }];
        let storage = std::mem::take(&mut self.workspace.scratch.guard_stack);
        let mut stack = GuardStack::new(&plan.scopes, storage);
        let (a, b) = schedule.run_enter;
        stack.enter(&schedule.order[a as usize..b as usize]);
        let launched = OnQueue::enter(plan.device.as_deref(), self.workspace.queue.as_deref())
            .and_then(|_on_queue| self.graph.launch());
        self.workspace.scratch.guard_stack = stack.finish();
        launched?;
        Ok(DeviceOutputs { plan, workspace: self.workspace })
    }

    /// The `i`-th input tensor the graph captured, to refill in place
    /// ([`DeviceTensor::copy_from_host`]) before the next replay. (Replaced by another tensor,
    /// it makes [`replay`](Self::replay) fail: a replay reads the memory captured.)
    pub fn input_mut(&mut self, i: usize) -> Option<&mut DeviceTensor> {
        self.inputs.get_mut(i).map(|t| &mut **t)
    }

    /// The NVTX ranges one replay pushes: the plan's run-level ones (with the current profiling
    /// setting), none per named scope, op or region.
    pub fn range_map(&self) -> RangeMap {
        let ranges = self.plan.range_map().ranges().iter().filter(|r| r.level == Level::Trace).cloned().collect();
        RangeMap { ranges }
    }
}
