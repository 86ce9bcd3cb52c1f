//! Running a plan: workspaces (the reusable buffers of one run at a time) and the run loop.
//!
//! The loop takes each step's output buffers out of the workspace for the duration of the
//! step, so that inputs can be borrowed from the same workspace at the same time without
//! `unsafe`; putting them back is a move, not an allocation.

use smallvec::SmallVec;

use std::sync::atomic::Ordering;

use super::compile::{Plan, Slot, Step, Work};
use super::device::DeviceBuffer;
use super::guard_schedule::{GuardStack, Schedule};
use crate::core::tensor::{Tensor, TensorMut, TensorRef};
use crate::error::{Error, Result};

/// The buffers one run of a plan writes. Made by [`Plan::workspace`]; reused across runs.
///
/// A workspace belongs to the plan that made it; one thread uses it at a time (`&mut`).
pub struct Workspace {
    plan_id: u64,
    buffers: Vec<Vec<f32>>,
    /// Device buffers, allocated by the first run.
    device_buffers: Vec<Option<Box<dyn DeviceBuffer>>>,
    /// Set while a run is in flight; still set afterwards if a kernel panicked, in which case
    /// the buffers may be incomplete and are rebuilt by the next run.
    in_flight: bool,
}

impl Workspace {
    /// Bytes held by its buffers.
    pub fn bytes(&self) -> usize {
        self.buffers.iter().map(|b| b.len() * std::mem::size_of::<f32>()).sum()
    }
}

/// The outputs of one run, borrowed from the workspace until the next run.
pub struct Outputs<'w> {
    plan: &'w Plan,
    workspace: &'w Workspace,
}

impl<'w> Outputs<'w> {
    /// The `i`-th output, or `None` past the end.
    pub fn get(&self, i: usize) -> Option<TensorRef<'w>> {
        let buffer = *self.plan.outputs.get(i)? as usize;
        Some(TensorRef { shape: &self.plan.buffer_shapes[buffer], data: &self.workspace.buffers[buffer] })
    }

    /// Number of outputs.
    pub fn len(&self) -> usize {
        self.plan.outputs.len()
    }

    /// Whether there are no outputs.
    pub fn is_empty(&self) -> bool {
        self.plan.outputs.is_empty()
    }

    /// Owned copies of all outputs.
    pub fn to_tensors(&self) -> Vec<Tensor> {
        (0..self.len()).filter_map(|i| self.get(i)).map(|t| t.to_tensor()).collect()
    }
}

impl Plan {
    /// A new workspace for this plan, with every host buffer allocated (device buffers are
    /// allocated by its first run).
    ///
    /// ```
    /// use boundscope::{executors::CpuReference, Arena, Error, Plan, Registry, TraceBuilder};
    /// let registry = Registry::with_builtins();
    /// let arena = Arena::new();
    /// let mut b = TraceBuilder::new(&arena, &registry);
    /// let x = b.input(&[1 << 60]).unwrap(); // a usable shape: 4 EiB of f32
    /// let y = b.exp(x).unwrap();
    /// b.output(y).unwrap();
    /// let plan = Plan::compile(&b.finish().unwrap(), &[CpuReference::shared()]).unwrap();
    /// assert!(matches!(plan.workspace(), Err(Error::OutOfMemory { .. })));
    /// ```
    ///
    /// # Errors
    /// [`Error::OutOfMemory`] if a buffer cannot be allocated.
    pub fn workspace(&self) -> Result<Workspace> {
        let mut buffers = Vec::with_capacity(self.buffer_shapes.len());
        for shape in &self.buffer_shapes {
            // Every shape of a plan is usable (the builder checks them), so this is its count.
            let numel = shape.iter().product::<usize>();
            let mut buffer = Vec::new();
            buffer.try_reserve_exact(numel).map_err(|_| Error::OutOfMemory {
                what: "Plan::workspace".into(),
                shape: shape.to_vec(),
                bytes: numel * std::mem::size_of::<f32>(),
            })?;
            buffer.resize(numel, 0.0);
            buffers.push(buffer);
        }
        Ok(Workspace { plan_id: self.id, buffers, device_buffers: Vec::new(), in_flight: false })
    }

    /// Runs the plan on `inputs` and returns owned outputs. Takes a workspace from the plan's
    /// pool (making one the first time, or when all are in use by other threads) and returns it
    /// afterwards.
    ///
    /// # Errors
    /// [`Error::OutOfMemory`] if it has to make a workspace and cannot, [`Error::InputCount`],
    /// [`Error::InputShape`], or the first error a kernel returns.
    pub fn run(&self, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
        let pooled = self.pool.lock().ok().and_then(|mut pool| pool.pop());
        let mut workspace = match pooled {
            Some(workspace) => workspace,
            None => self.workspace()?,
        };
        let views: SmallVec<[TensorRef<'_>; 8]> = inputs.iter().map(|t| t.view()).collect();
        let result = self.run_with(&mut workspace, &views).map(|outputs| outputs.to_tensors());
        if let Ok(mut pool) = self.pool.lock() {
            pool.push(workspace);
        }
        result
    }

    /// Runs the plan on `inputs` in a workspace the caller holds; the outputs borrow it.
    /// Allocates nothing in steady state.
    ///
    /// # Errors
    /// [`Error::WorkspaceMismatch`], [`Error::InputCount`], [`Error::InputShape`],
    /// [`Error::InputLength`], [`Error::OutOfMemory`] if a run interrupted by a panic left the
    /// workspace to be rebuilt and it cannot be, or the first error a kernel returns (the
    /// remaining steps are not run).
    pub fn run_with<'w>(&'w self, workspace: &'w mut Workspace, inputs: &[TensorRef<'_>]) -> Result<Outputs<'w>> {
        if workspace.plan_id != self.id {
            return Err(Error::WorkspaceMismatch);
        }
        self.check_inputs(inputs)?;
        if workspace.in_flight {
            *workspace = self.workspace()?;
        }
        if let (Some(device), true) = (&self.device, workspace.device_buffers.len() != self.device_lengths.len()) {
            workspace.device_buffers =
                self.device_lengths.iter().map(|&len| device.alloc(len).map(Some)).collect::<Result<_>>()?;
        }
        workspace.in_flight = true;
        let schedule = &self.schedules[if self.profiling.load(Ordering::Relaxed) { 0 } else { 1 }];
        let result = if schedule.is_empty() {
            self.run_unguarded(workspace, inputs)
        } else {
            self.run_guarded(schedule, workspace, inputs)
        };
        // Every step puts its buffers back, even when it fails: the workspace is whole.
        workspace.in_flight = false;
        result.map(|()| Outputs { plan: self, workspace })
    }

    /// The run loop without guards (none attached, or profiling off and all are profiling
    /// guards).
    fn run_unguarded(&self, workspace: &mut Workspace, inputs: &[TensorRef<'_>]) -> Result<()> {
        for step in &self.steps {
            self.run_step(step, workspace, inputs)?;
        }
        Ok(())
    }

    /// The run loop with guards: enters and exits scopes around steps, on this thread. The
    /// stack exits whatever is still entered, innermost first, on error and on panic.
    fn run_guarded(&self, schedule: &Schedule, workspace: &mut Workspace, inputs: &[TensorRef<'_>]) -> Result<()> {
        let order = &schedule.order;
        let mut stack = GuardStack::new(&self.scopes);
        let (a, b) = schedule.run_enter;
        stack.enter(&order[a as usize..b as usize]);
        for (i, step) in self.steps.iter().enumerate() {
            let (a, b) = schedule.enter[i];
            if a != b {
                stack.enter(&order[a as usize..b as usize]);
            }
            self.run_step(step, workspace, inputs)?;
            let exits = schedule.exit[i];
            if exits != 0 {
                stack.exit(exits);
            }
        }
        Ok(())
    }

    fn check_inputs(&self, inputs: &[TensorRef<'_>]) -> Result<()> {
        if inputs.len() != self.input_shapes.len() {
            return Err(Error::InputCount { expected: self.input_shapes.len(), got: inputs.len() });
        }
        for (index, (input, expected)) in inputs.iter().zip(&self.input_shapes).enumerate() {
            if input.shape != expected.as_slice() {
                return Err(Error::InputShape { index, expected: expected.to_vec(), got: input.shape.to_vec() });
            }
            // The trace's shapes are usable (the builder checks them), so this is the count.
            let numel = expected.iter().product::<usize>();
            if input.data.len() != numel {
                return Err(Error::InputLength {
                    index,
                    shape: expected.to_vec(),
                    expected: numel,
                    got: input.data.len(),
                });
            }
        }
        Ok(())
    }

    /// Runs one step. Output buffers are moved out of the workspace for the duration of the
    /// kernel call and moved back afterwards, also when the kernel fails.
    #[inline(always)]
    fn run_step(&self, step: &Step, workspace: &mut Workspace, inputs: &[TensorRef<'_>]) -> Result<()> {
        let kernel = match &step.work {
            Work::Host(kernel) => kernel,
            other => return self.run_device_step(other, step, workspace, inputs),
        };
        if let [buffer] = step.outputs[..] {
            // The common case, one output: no list of taken buffers to build.
            let mut data = std::mem::take(&mut workspace.buffers[buffer as usize]);
            let result = {
                let mut views = SmallVec::new();
                self.input_views(&mut views, step, &workspace.buffers, inputs);
                let mut outs = [TensorMut { shape: &self.buffer_shapes[buffer as usize], data: &mut data }];
                kernel.run(&views, &mut outs)
            };
            workspace.buffers[buffer as usize] = data;
            return result;
        }
        let mut taken: SmallVec<[Vec<f32>; 2]> = SmallVec::new();
        for &b in &step.outputs {
            taken.push(std::mem::take(&mut workspace.buffers[b as usize]));
        }
        let result = {
            let mut views = SmallVec::new();
            self.input_views(&mut views, step, &workspace.buffers, inputs);
            let mut outs: SmallVec<[TensorMut<'_>; 2]> = SmallVec::new();
            for (data, &b) in taken.iter_mut().zip(&step.outputs) {
                outs.push(TensorMut { shape: &self.buffer_shapes[b as usize], data });
            }
            kernel.run(&views, &mut outs)
        };
        for (data, &b) in taken.into_iter().zip(&step.outputs) {
            workspace.buffers[b as usize] = data;
        }
        result
    }

    #[inline(always)]
    fn input_views<'v>(
        &'v self,
        views: &mut SmallVec<[TensorRef<'v>; 4]>,
        step: &Step,
        buffers: &'v [Vec<f32>],
        inputs: &[TensorRef<'v>],
    ) {
        for slot in &step.inputs {
            views.push(match *slot {
                Slot::Input(i) => inputs[i as usize],
                Slot::Buffer(b) => TensorRef { shape: &self.buffer_shapes[b as usize], data: &buffers[b as usize] },
                // Compilation gives host kernels host slots only (downloads come first).
                Slot::Device(_) => TensorRef { shape: &[], data: &[] },
            });
        }
    }

    /// Runs a device kernel or a transfer.
    #[inline(never)]
    fn run_device_step(
        &self,
        work: &Work,
        step: &Step,
        workspace: &mut Workspace,
        inputs: &[TensorRef<'_>],
    ) -> Result<()> {
        let missing = || Error::Execution {
            executor: "runtime".into(),
            symbol: step.line.clone(),
            message: "a device buffer is missing: the plan has no device, or a previous run was interrupted".into(),
        };
        let device = self.device.as_ref().ok_or_else(missing)?;
        let device_slot = |slot: &Slot| match *slot {
            Slot::Device(d) => Some(d as usize),
            _ => None,
        };
        match work {
            Work::Upload => {
                let source: &[f32] = match step.inputs[0] {
                    Slot::Input(i) => inputs[i as usize].data,
                    Slot::Buffer(b) => &workspace.buffers[b as usize],
                    Slot::Device(_) => return Err(missing()),
                };
                let target = workspace.device_buffers[step.outputs[0] as usize].as_deref_mut().ok_or_else(missing)?;
                device.upload(source, target)
            }
            Work::Download => {
                let d = device_slot(&step.inputs[0]).ok_or_else(missing)?;
                let source = workspace.device_buffers[d].as_deref().ok_or_else(missing)?;
                device.download(source, &mut workspace.buffers[step.outputs[0] as usize])
            }
            Work::Device(kernel) => {
                // Taken out for the call and always put back, whatever happens in between.
                let mut taken: SmallVec<[Option<Box<dyn DeviceBuffer>>; 2]> =
                    step.outputs.iter().map(|&o| workspace.device_buffers[o as usize].take()).collect();
                let result = (|| {
                    let mut views: SmallVec<[&dyn DeviceBuffer; 4]> = SmallVec::new();
                    for slot in &step.inputs {
                        let d = device_slot(slot).ok_or_else(missing)?;
                        views.push(workspace.device_buffers[d].as_deref().ok_or_else(missing)?);
                    }
                    let mut outs: SmallVec<[&mut dyn DeviceBuffer; 2]> = SmallVec::new();
                    for buffer in taken.iter_mut() {
                        outs.push(buffer.as_deref_mut().ok_or_else(missing)?);
                    }
                    kernel.run(&views, &mut outs)
                })();
                for (buffer, &o) in taken.into_iter().zip(&step.outputs) {
                    workspace.device_buffers[o as usize] = buffer;
                }
                result
            }
            Work::Host(_) => Err(missing()),
        }
    }
}
