//! Graphs: a plan's run captured once on its device and replayed as one launch.
//!
//! A replay costs one launch on the host, whatever the number of steps, so it suits small,
//! latency-bound plans run many times with the same inputs (weights bound on the device, an
//! activation buffer refilled in place). What a replay runs is what the capture recorded: the
//! device work of every step, on the same device memory. Host code does not replay, so per-op
//! and per-region guards (NVTX ranges, recorders, timers) do not run in replays; the plan's
//! run-level guards (those attached with `attach_trace_guard`) surround each replay, and
//! [`PlanGraph::range_map`] lists the ranges a replay pushes. Profile in stream mode
//! ([`Plan::run_on_device`]) to see each op.

use super::compile::{Plan, Work};
use super::device::DeviceGraph;
use super::executor::RunDecision;
use super::guard_schedule::GuardStack;
use super::range_map::RangeMap;
use super::workspace::{DeviceOutputs, Workspace};
use super::{PlanInput, RunInput};
use crate::core::guards::Level;
use crate::error::{Error, Result};

/// A plan's run captured as a device graph, with the workspace and the device inputs it
/// captured. Made by [`Plan::capture`].
pub struct PlanGraph<'w> {
    plan: &'w Plan,
    workspace: &'w mut Workspace,
    graph: Box<dyn DeviceGraph>,
    /// The addresses of the device buffers captured as inputs, in order.
    inputs: Vec<usize>,
}

fn address(input: RunInput<'_>) -> Option<usize> {
    match input {
        RunInput::Device(tensor) => Some(tensor.buffer() as *const dyn super::DeviceBuffer as *const () as usize),
        RunInput::Host(_) => None,
    }
}

impl Plan {
    /// Captures one run of this plan on its device as a graph, replayed by
    /// [`PlanGraph::replay`] as one launch. Every step must run on the device, and every input
    /// must be given there ([`RunInput::Device`]): a graph replays the same device memory, so
    /// replays take the same device tensors (refill them in place to change the data). The run
    /// is made once first, uncaptured, so that kernels are loaded and buffers allocated.
    ///
    /// # Errors
    /// [`Error::GraphUnsupported`] for a plan with host steps, an input given on the host, or a
    /// device that cannot capture; the errors of [`run_on_device`](Self::run_on_device).
    pub fn capture<'w, I: PlanInput>(&'w self, workspace: &'w mut Workspace, inputs: &[I]) -> Result<PlanGraph<'w>> {
        let unsupported = |reason: String| Err(Error::GraphUnsupported { reason });
        let Some(device) = self.device.clone() else {
            return unsupported("this plan has no device steps; compile it with device executors".into());
        };
        let mut addresses = Vec::with_capacity(inputs.len());
        for (index, input) in inputs.iter().enumerate() {
            match address(input.as_run_input()) {
                Some(a) => addresses.push(a),
                None => {
                    return unsupported(format!(
                    "input {index} is on the host; a graph replays device memory: upload it (`DeviceTensor::upload`)"
                ))
                }
            }
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
        // Uncaptured first: kernels loaded, buffers and library handles allocated.
        self.run_on_device(workspace, inputs)?;
        device.synchronize()?;
        device.begin_capture()?;
        let captured = self.run_placed(workspace, inputs, true, |plan, workspace, run| {
            plan.check_inputs(run)?;
            // Host-side code does not replay: record no region ranges either.
            let _decision = RunDecision::enter(false);
            plan.run_unguarded(workspace, run)
        });
        let graph = device.end_capture();
        captured?;
        Ok(PlanGraph { plan: self, workspace, graph: graph?, inputs: addresses })
    }
}

impl PlanGraph<'_> {
    /// Queues one replay of the captured run, inside the plan's run-level guards, and returns
    /// its outputs on the device (as [`Plan::run_on_device`] does). `inputs` must be the device
    /// tensors the graph captured, in order.
    ///
    /// # Errors
    /// [`Error::GraphUnsupported`] for other inputs; the device's launch error.
    pub fn replay<I: PlanInput>(&mut self, inputs: &[I]) -> Result<DeviceOutputs<'_>> {
        let same = inputs.len() == self.inputs.len()
            && inputs.iter().zip(&self.inputs).all(|(i, &a)| address(i.as_run_input()) == Some(a));
        if !same {
            return Err(Error::GraphUnsupported {
                reason: "a graph replays the device tensors it captured: pass the same ones, in order (refill them in \
                         place to change the data), or capture again"
                    .into(),
            });
        }
        let plan = self.plan;
        let schedule = &plan.schedules[if plan.profiling() { 0 } else { 1 }];
        let storage = std::mem::take(&mut self.workspace.scratch.guard_stack);
        let mut stack = GuardStack::new(&plan.scopes, storage);
        let (a, b) = schedule.run_enter;
        stack.enter(&schedule.order[a as usize..b as usize]);
        let launched = self.graph.launch();
        self.workspace.scratch.guard_stack = stack.finish();
        launched?;
        Ok(DeviceOutputs { plan, workspace: self.workspace })
    }

    /// The NVTX ranges one replay pushes: the plan's run-level ones (with the current profiling
    /// setting), none per op or region.
    pub fn range_map(&self) -> RangeMap {
        let ranges = self.plan.range_map().ranges().iter().filter(|r| r.level == Level::Trace).cloned().collect();
        RangeMap { ranges }
    }
}
