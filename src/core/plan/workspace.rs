//! Running a plan: workspaces (the reusable buffers of one run at a time) and the run loop.
//!
//! The loop takes a wide step's output buffers out of the workspace for the duration of the
//! step, so that inputs can be borrowed from the same workspace at the same time; putting them
//! back is a move, not an allocation. A narrow step (one output, at most four inputs, none of
//! them its output) borrows its output in place.

use std::mem::MaybeUninit;
use std::sync::atomic::Ordering;

use super::compile::{Plan, Slot, Step, Work, NARROW_INPUTS};
use super::device::{Device, DeviceQueue};
use super::device::{DeviceBuffer, Vacant};
use super::device_tensor::{download, DeviceTensor, PlanInput, RunInput, RunInputMut};
use super::executor::{MapKernel, RunDecision};
use super::guard_schedule::{GuardStack, Schedule};
use super::packing;
use crate::core::ir::DType;
use crate::core::tensor::{Data, Storage, Tensor, TensorMut, TensorRef};
use crate::error::{Error, Result};
use std::sync::Arc;

/// The buffers one run of a plan writes. Made by [`Plan::workspace`]; reused across runs.
///
/// A workspace belongs to the plan that made it; one thread uses it at a time (`&mut`).
pub struct Workspace {
    pub(super) plan_id: u64,
    buffers: Vec<Storage>,
    /// Device buffers, allocated by the first run.
    pub(super) device_buffers: Vec<Option<Box<dyn DeviceBuffer>>>,
    /// Per device buffer: whether it is a range of the shared block; and the block's words.
    in_block: Vec<bool>,
    block_words: usize,
    /// Its own queue on the device, made by its first run (when the device has queues).
    pub(super) queue: Option<Box<dyn DeviceQueue>>,
    /// Whether its runs go to the device's own queue ([`Plan::workspace_on_device_queue`])
    /// rather than to a queue of their own.
    pub(super) on_device_queue: bool,
    /// Set while a run is in flight; still set afterwards if a kernel panicked, in which case
    /// the buffers may be incomplete and are rebuilt by the next run.
    pub(super) in_flight: bool,
    /// The run loop's per-step lists, sized when the workspace is made for the plan's widest
    /// step and deepest guard nesting, so that no run allocates.
    pub(super) scratch: RunScratch,
    /// Per output: whether the last run exchanged its device buffer with the input it updates
    /// ([`Plan::run_updating_on_device`]): its value is in that input now.
    pub(super) exchanged: Vec<bool>,
}

/// Reusable lists of the run loop. Lists of borrowed views are kept empty between steps, with
/// `'static` in their type; [`recycle`] lends their allocation to the lifetimes of one step.
#[derive(Default)]
pub(super) struct RunScratch {
    pub(super) guard_stack: Vec<(u32, u64)>,
    input_views: Vec<TensorRef<'static>>,
    output_views: Vec<TensorMut<'static>>,
    taken: Vec<Storage>,
    device_inputs: Vec<&'static dyn DeviceBuffer>,
    device_outputs: Vec<&'static mut dyn DeviceBuffer>,
    device_taken: Vec<Option<Box<dyn DeviceBuffer>>>,
    host_inputs: Vec<TensorRef<'static>>,
    device_run_inputs: Vec<Option<&'static dyn DeviceBuffer>>,
    /// Values other than `f32` as device words, for their transfers (grown once to the largest
    /// such transfer, then reused).
    packed: Vec<f32>,
    /// Per input: whether the run in progress lent its memory to the workspace (an update
    /// written over it: see [`Plan::run_updating_on_device`]).
    lent: Vec<bool>,
    /// Per input: what its workspace buffer held while the input's memory was lent there.
    parked: Vec<Option<Box<dyn DeviceBuffer>>>,
}

/// What a kernel run in place finds at the position of the input its output overwrites.
static VACANT: Vacant = Vacant;

/// An empty list with the allocation of `list`, for elements of the same type with other
/// lifetimes (the standard library collects a mapped `vec::IntoIter` in place, reusing the
/// allocation, when the element layouts match, as they do here).
#[inline(always)]
fn recycle<T, U>(mut list: Vec<T>) -> Vec<U> {
    list.clear();
    list.into_iter().map(|_| unreachable!("the list was cleared")).collect()
}

/// Runs a narrow step whose kernel is a map ([`Narrow::map`](super::compile::Narrow::map)):
/// its inputs' and output's `f32` values straight to [`MapKernel::map`]. A buffer of another
/// dtype or length (a workspace of another plan) is [`Error::WorkspaceMismatch`].
///
/// # Safety
/// `storage` points to at least `output + 1` buffers and to every buffer `slots` names, and no
/// slot names `output`.
#[inline(always)]
unsafe fn run_map(
    map: &dyn MapKernel,
    slots: &[Slot],
    output: usize,
    storage: *mut Storage,
    inputs: &[TensorRef<'_>],
) -> Result<()> {
    // SAFETY: in bounds, and no input borrows it (the caller's promise). (Borrowed first, but
    // used after the inputs' shared borrows of other elements.)
    let Storage::F32(out) = (unsafe { &mut *storage.add(output) }) else {
        return Err(Error::WorkspaceMismatch);
    };
    let n = out.len();
    let mut values = [MaybeUninit::<&[f32]>::uninit(); NARROW_INPUTS];
    for (value, &slot) in values.iter_mut().zip(slots) {
        let x = match slot {
            Slot::Input(i) => match inputs[i as usize].data {
                Data::F32(x) => x,
                // `check_inputs` has checked the dtypes of host inputs.
                other => return Err(Error::InputDType { index: i as usize, expected: DType::F32, got: other.dtype() }),
            },
            // SAFETY: in bounds and not `output` (the caller's promise): a shared borrow of an
            // element other than the one borrowed exclusively below.
            Slot::Buffer(b) => match unsafe { &*storage.add(b as usize) } {
                Storage::F32(x) => x.as_slice(),
                _ => return Err(Error::WorkspaceMismatch),
            },
            Slot::Device(_) => return Err(Error::WorkspaceMismatch),
        };
        if x.len() != n {
            return Err(Error::WorkspaceMismatch);
        }
        value.write(x);
    }
    // SAFETY: the first `slots.len()` values (at most `NARROW_INPUTS`) were written just above
    // (and `&[f32]` is `Copy`: nothing to drop).
    let values = unsafe { std::slice::from_raw_parts(values.as_ptr().cast::<&[f32]>(), slots.len()) };
    map.map(values, out);
    Ok(())
}

impl Workspace {
    /// Bytes held by its host buffers.
    pub fn bytes(&self) -> usize {
        self.buffers.iter().map(Storage::bytes).sum()
    }

    /// Bytes of device memory held by its device buffers: none before its first run, then
    /// every buffer of the plan's device steps ([`Plan::device_bytes`]) except the uploads of
    /// inputs that its runs so far gave on the device (those read the caller's tensor; but a
    /// run other than [`Plan::run_updating_on_device`] copies an input that an update is
    /// written over, into a buffer of the workspace).
    ///
    /// ```
    /// use boundscope::{executors::CpuReference, Arena, Plan, Registry, TraceBuilder};
    /// let (registry, arena) = (Registry::with_builtins(), Arena::new());
    /// let mut b = TraceBuilder::new(&arena, &registry);
    /// let x = b.input(&[1024]).unwrap();
    /// let y = b.exp(x).unwrap();
    /// b.output(y).unwrap();
    /// let plan = Plan::compile(&b.finish().unwrap(), &[CpuReference::shared()]).unwrap();
    /// assert_eq!(plan.workspace().unwrap().device_bytes(), 0); // no device steps
    /// ```
    pub fn device_bytes(&self) -> usize {
        let own: usize = (self.device_buffers.iter().enumerate())
            .filter(|&(d, _)| !self.in_block.get(d).copied().unwrap_or(false))
            .filter_map(|(_, b)| b.as_ref().map(|b| b.len()))
            .sum();
        (own + self.block_words) * std::mem::size_of::<f32>()
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
        Some(TensorRef { shape: &self.plan.buffers[buffer].shape, data: self.workspace.buffers[buffer].data() })
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
        let mut buffers = Vec::with_capacity(self.buffers.len());
        for crate::core::ir::TensorMeta { shape, dtype } in &self.buffers {
            // Every shape of a plan is usable (the builder checks them), so this is its count.
            let numel = shape.iter().product::<usize>();
            buffers.push(Storage::try_zeros(*dtype, numel, "Plan::workspace", shape)?);
        }
        Ok(Workspace {
            plan_id: self.id,
            buffers,
            device_buffers: Vec::new(),
            in_block: Vec::new(),
            block_words: 0,
            queue: None,
            on_device_queue: false,
            in_flight: false,
            exchanged: vec![false; self.outputs.len()],
            scratch: RunScratch {
                guard_stack: Vec::with_capacity(self.widths.guard_depth),
                input_views: Vec::with_capacity(self.widths.inputs),
                output_views: Vec::with_capacity(self.widths.outputs),
                taken: Vec::with_capacity(self.widths.outputs),
                device_inputs: Vec::with_capacity(self.widths.inputs),
                device_outputs: Vec::with_capacity(self.widths.outputs),
                device_taken: Vec::with_capacity(self.widths.outputs),
                host_inputs: Vec::with_capacity(self.input_shapes.len()),
                device_run_inputs: Vec::with_capacity(self.input_shapes.len()),
                packed: Vec::new(),
                lent: vec![false; self.input_shapes.len()],
                parked: (0..self.input_shapes.len()).map(|_| None).collect(),
            },
        })
    }

    /// A workspace whose runs go to the device's own queue ([`Device::device_queue`]), in
    /// order with the work queued there outside runs (uploads, downloads, frees), rather than
    /// to a queue of their own ([`workspace`](Self::workspace)).
    ///
    /// A run on a queue of its own keeps its order with the device's queue by the device's
    /// events: on CUDA, one event recorded per run in steady state, about 0.5 us of host time
    /// (measured on an H100: a tenth of what a one-step plan takes to queue). A run here records
    /// none. Use it for plans of a few short steps queued from one thread, where that share
    /// counts. What it costs:
    /// - the runs of such workspaces share one queue: they never overlap each other on the
    ///   device, and their kernels interleave, in the order they are queued, when several
    ///   threads run them at once (runs of workspaces with queues of their own still overlap
    ///   them);
    /// - work a kernel queues on the run's queue (a user's `CudaRun::stream` on CUDA) is on the
    ///   queue every thread's transfers use: a kernel that waits for its queue waits for those
    ///   too;
    /// - such a workspace cannot be captured as a graph ([`Plan::capture`] returns
    ///   [`Error::GraphUnsupported`]: other threads' transfers on the device's queue would join
    ///   the graph).
    ///
    /// On a device of one queue, and for plans without device steps, it runs as a workspace
    /// made by [`workspace`](Self::workspace) does.
    ///
    /// ```
    /// use boundscope::{executors::CpuReference, Arena, Plan, Registry, Tensor, TraceBuilder};
    /// let registry = Registry::with_builtins();
    /// let arena = Arena::new();
    /// let mut b = TraceBuilder::new(&arena, &registry);
    /// let x = b.input(&[4]).unwrap();
    /// let y = b.exp(x).unwrap();
    /// b.output(y).unwrap();
    /// let plan = Plan::compile(&b.finish().unwrap(), &[CpuReference::shared()]).unwrap();
    /// let mut workspace = plan.workspace_on_device_queue().unwrap();
    /// let x = Tensor::from_fn(&[4], |i| i as f32);
    /// let y = plan.run_with(&mut workspace, &[&x]).unwrap();
    /// assert_eq!(y.get(0).unwrap().values::<f32>().unwrap()[0], 1.0);
    /// ```
    ///
    /// # Errors
    /// As [`workspace`](Self::workspace).
    pub fn workspace_on_device_queue(&self) -> Result<Workspace> {
        let mut workspace = self.workspace()?;
        workspace.on_device_queue = true;
        Ok(workspace)
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
        let result = self.run_with(&mut workspace, inputs).map(|outputs| outputs.to_tensors());
        if let Ok(mut pool) = self.pool.lock() {
            pool.push(workspace);
        }
        result
    }

    /// Runs the plan on `inputs` in a workspace the caller holds; the outputs borrow it, on the
    /// host. Allocates nothing in steady state. Inputs are host views ([`TensorRef`]) or
    /// [`RunInput`]s: an input given on the plan's device ([`RunInput::Device`]) is read there,
    /// and its upload step is skipped; except an input whose update a kernel writes over it
    /// ([`DeviceKernel::in_place`](crate::DeviceKernel::in_place)), which this run must leave
    /// as it is: it is copied on the device into a workspace buffer of its length first (only
    /// [`run_updating_on_device`](Self::run_updating_on_device) reads it in place).
    ///
    /// # Errors
    /// [`Error::WorkspaceMismatch`], [`Error::InputCount`], [`Error::InputShape`],
    /// [`Error::InputLength`], [`Error::InputPlacement`] (a device input of another device, or
    /// that a host step reads), [`Error::OutOfMemory`] if a run interrupted by a panic left the
    /// workspace to be rebuilt and it cannot be, or the first error a kernel returns (the
    /// remaining steps are not run).
    pub fn run_with<'w, I: PlanInput>(&'w self, workspace: &'w mut Workspace, inputs: &[I]) -> Result<Outputs<'w>> {
        self.run_placed(workspace, inputs, false, Self::run_checked)?;
        Ok(Outputs { plan: self, workspace })
    }

    /// Like [`run_with`](Self::run_with), leaving on the device every output that a device step
    /// computes (their downloads are skipped): the run is queued on the device and this returns
    /// without waiting for it. Read an output on the host with [`DeviceOutputs::to_host`], which
    /// waits; pass it to another plan with [`DeviceOutputs::device_buffer`].
    ///
    /// # Errors
    /// As for [`run_with`](Self::run_with).
    pub fn run_on_device<'w, I: PlanInput>(
        &'w self,
        workspace: &'w mut Workspace,
        inputs: &[I],
    ) -> Result<DeviceOutputs<'w>> {
        self.run_placed(workspace, inputs, true, Self::run_checked)?;
        Ok(DeviceOutputs { plan: self, workspace })
    }

    /// Runs the plan like [`run_with`](Self::run_with), then writes each in-place update
    /// ([`TraceBuilder::update`](crate::TraceBuilder::update)) back into its input's tensor: a
    /// training step updating its parameters and optimizer state. Allocates nothing in steady
    /// state; the outputs (updates included) stay readable until the next run.
    ///
    /// # Errors
    /// As for [`run_with`](Self::run_with); when it fails, no input is written.
    pub fn run_updating<'w>(&'w self, workspace: &'w mut Workspace, inputs: &mut [&mut Tensor]) -> Result<Outputs<'w>> {
        self.run_placed(workspace, inputs, false, Self::run_checked)?;
        for &(input, output) in &self.updates {
            let buffer = &workspace.buffers[self.outputs[output as usize] as usize];
            let target = &mut inputs[input as usize];
            crate::core::tensor::with_same_values!(buffer.data(), target.data_mut(), (x, out) => out.copy_from_slice(x), _ => {
                return Err(Error::InvalidUpdate { detail: format!("input {input} changed dtype") })
            });
        }
        Ok(Outputs { plan: self, workspace })
    }

    /// [`run_updating`](Self::run_updating) with inputs on the host or on the plan's device, the
    /// outputs left where a device step computed them (as [`run_on_device`](Self::run_on_device)):
    /// a training step whose parameters and optimizer state live on the device. An update of an
    /// input given on the device is written over the input's own memory where the kernel that
    /// computes it can ([`DeviceKernel::in_place`](crate::DeviceKernel::in_place): the built-in
    /// CUDA executors' fused optimizer steps can), so that the step holds one copy of what it
    /// updates; else it exchanges the input's buffer with the output's (no copy, no allocation:
    /// the workspace keeps the old buffer for the next run's output). An update of an input on
    /// the host is copied there (downloaded, waiting for the device, if a device step computed
    /// it: give such inputs on the device).
    ///
    /// Updates written over their inputs are written as the run goes: when a step after the
    /// optimizer's fails (or a kernel that checks its inputs after the run reports, as an id
    /// out of range), the error comes back with those inputs already updated; the exchange,
    /// and inputs on the host, write nothing on an error. Each input gets its memory back
    /// also on an error and when a kernel panics, except when the kernel that writes over it
    /// panics (the input is then left empty, and the next run reports its length).
    ///
    /// # Errors
    /// As for [`run_on_device`](Self::run_on_device), and the device's copy errors.
    pub fn run_updating_on_device<'w>(
        &'w self,
        workspace: &'w mut Workspace,
        inputs: &mut [RunInputMut<'_>],
    ) -> Result<DeviceOutputs<'w>> {
        let lent = self.lend_updated_inputs(workspace, inputs)?;
        // Given back whatever happened, a panic included: each holds its update now (or, after
        // an error, what the run left there).
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.run_placed_lending(workspace, inputs, true, &lent, Self::run_checked)
        }));
        self.give_back_lent(workspace, inputs, &lent);
        workspace.scratch.lent = lent;
        result.unwrap_or_else(|panic| std::panic::resume_unwind(panic))?;
        for &(input, output) in &self.updates {
            let on_device = self.device_io.output_on_device[output as usize].map(|d| d as usize);
            if workspace.scratch.lent[input as usize] {
                // Written over the input's own memory: every output held there is the input's.
                for (o, held) in self.device_io.output_on_device.iter().enumerate() {
                    if on_device.is_some_and(|d| *held == Some(d as u32)) {
                        workspace.exchanged[o] = true;
                    }
                }
                continue;
            }
            let buffer = self.outputs[output as usize] as usize;
            let (shape, dtype) = (&self.buffers[buffer].shape, self.buffers[buffer].dtype);
            match (&mut inputs[input as usize], on_device, &self.device) {
                (RunInputMut::Device(target), Some(d), _) => match workspace.device_buffers.get_mut(d) {
                    Some(Some(computed)) if computed.len() == target.buffer().len() => {
                        target.swap_buffer(computed);
                        // Every output held by that buffer (a value returned twice) is the
                        // input's now.
                        for (o, held) in self.device_io.output_on_device.iter().enumerate() {
                            if *held == Some(d as u32) {
                                workspace.exchanged[o] = true;
                            }
                        }
                    }
                    _ => {
                        return Err(Error::InvalidUpdate {
                            detail: format!("output {output} has no device buffer of its input's length"),
                        })
                    }
                },
                (RunInputMut::Device(target), None, _) => {
                    target.copy_from_host(TensorRef { shape, data: workspace.buffers[buffer].data() })?
                }
                (RunInputMut::Host(target), Some(d), Some(device)) => {
                    let computed = workspace.device_buffers.get(d).and_then(|b| b.as_deref()).ok_or_else(|| {
                        Error::InvalidUpdate { detail: format!("output {output} has no device buffer") }
                    })?;
                    **target = download(&**device, computed, shape, dtype)?;
                }
                (RunInputMut::Host(target), _, _) => {
                    crate::core::tensor::with_same_values!(workspace.buffers[buffer].data(), target.data_mut(), (x, out) => out.copy_from_slice(x), _ => {
                        return Err(Error::InvalidUpdate { detail: format!("input {input} changed dtype") })
                    });
                }
            }
        }
        Ok(DeviceOutputs { plan: self, workspace })
    }

    /// The plan's in-place updates: `(input index, output index)` pairs, the output replacing
    /// the input after each [`run_updating`](Self::run_updating).
    pub fn updates(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        self.updates.iter().map(|&(i, o)| (i as usize, o as usize))
    }

    /// The device of this plan's device executors, if it has any: where its device inputs live.
    pub fn device(&self) -> Option<&Arc<dyn Device>> {
        self.device.as_ref()
    }

    /// Moves the memory of each input given on the device whose update a step writes over it
    /// (see `in_place`) into the workspace, for the run: the tensor holds none meanwhile. Returns
    /// which inputs it lent (the workspace's list, to put back). Checks every such input first,
    /// and makes the workspace whole, so that nothing lent is lost to a rebuild.
    fn lend_updated_inputs(&self, workspace: &mut Workspace, inputs: &mut [RunInputMut<'_>]) -> Result<Vec<bool>> {
        if workspace.plan_id != self.id {
            return Err(Error::WorkspaceMismatch);
        }
        if inputs.len() != self.input_shapes.len() {
            return Err(Error::InputCount { expected: self.input_shapes.len(), got: inputs.len() });
        }
        let mut lent = std::mem::take(&mut workspace.scratch.lent);
        lent.clear();
        lent.resize(inputs.len(), false);
        let written_over = || {
            let io = &self.device_io;
            (0..io.written_over.len()).filter(|&d| io.written_over[d]).filter_map(|d| Some((d, io.uploaded_input[d]?)))
        };
        let mut any = false;
        for (_, i) in written_over() {
            if let RunInputMut::Device(target) = &inputs[i as usize] {
                if let Err(e) = self.check_device_input(i as usize, target) {
                    workspace.scratch.lent = lent;
                    return Err(e);
                }
                any = true;
            }
        }
        if !any {
            return Ok(lent);
        }
        if let Err(e) = self.prepare_device_buffers(workspace) {
            workspace.scratch.lent = lent;
            return Err(e);
        }
        for (d, i) in written_over() {
            if let RunInputMut::Device(target) = &mut inputs[i as usize] {
                let mut memory: Box<dyn DeviceBuffer> = Box::new(Vacant);
                target.swap_buffer(&mut memory);
                workspace.scratch.parked[i as usize] = workspace.device_buffers[d].replace(memory);
                lent[i as usize] = true;
            }
        }
        Ok(lent)
    }

    /// Ends [`lend_updated_inputs`](Self::lend_updated_inputs): each lent input gets its memory
    /// back, and the workspace what it held.
    fn give_back_lent(&self, workspace: &mut Workspace, inputs: &mut [RunInputMut<'_>], lent: &[bool]) {
        let io = &self.device_io;
        for d in (0..io.written_over.len()).filter(|&d| io.written_over[d]) {
            let Some(i) = io.uploaded_input[d].map(|i| i as usize).filter(|&i| lent[i]) else {
                continue;
            };
            if let (RunInputMut::Device(target), Some(mut memory)) =
                (&mut inputs[i], workspace.device_buffers[d].take())
            {
                target.swap_buffer(&mut memory);
            }
            workspace.device_buffers[d] = workspace.scratch.parked[i].take();
        }
    }

    /// Sorts `inputs` into host views and device buffers, checks the device ones, and runs
    /// `body` on them.
    pub(super) fn run_placed<I: PlanInput>(
        &self,
        workspace: &mut Workspace,
        inputs: &[I],
        outputs_on_device: bool,
        body: impl FnOnce(&Self, &mut Workspace, &Run<'_>) -> Result<()>,
    ) -> Result<()> {
        self.run_placed_lending(workspace, inputs, outputs_on_device, &[], body)
    }

    /// [`run_placed`](Self::run_placed) where the inputs marked in `lent` lent their memory to
    /// the workspace ([`lend_updated_inputs`](Self::lend_updated_inputs)).
    fn run_placed_lending<I: PlanInput>(
        &self,
        workspace: &mut Workspace,
        inputs: &[I],
        outputs_on_device: bool,
        lent: &[bool],
        body: impl FnOnce(&Self, &mut Workspace, &Run<'_>) -> Result<()>,
    ) -> Result<()> {
        if workspace.plan_id != self.id {
            return Err(Error::WorkspaceMismatch);
        }
        workspace.exchanged.fill(false);
        if inputs.len() != self.input_shapes.len() {
            return Err(Error::InputCount { expected: self.input_shapes.len(), got: inputs.len() });
        }
        let mut host = recycle(std::mem::take(&mut workspace.scratch.host_inputs));
        let mut device = recycle(std::mem::take(&mut workspace.scratch.device_run_inputs));
        let mut placed = Ok(());
        for (index, input) in inputs.iter().enumerate() {
            match input.as_run_input() {
                RunInput::Host(tensor) => {
                    host.push(tensor);
                    device.push(None);
                }
                RunInput::Device(tensor) => {
                    // (A lent input was checked before it lent its memory.)
                    if placed.is_ok() && !lent.get(index).copied().unwrap_or(false) {
                        placed = self.check_device_input(index, tensor);
                    }
                    host.push(TensorRef { shape: tensor.shape(), data: Data::empty(tensor.dtype()) });
                    device.push(Some(tensor.buffer()));
                }
            }
        }
        let result = placed.and_then(|()| {
            let run = Run { host: &host, device: &device, outputs_on_device, lent };
            body(self, workspace, &run)
        });
        workspace.scratch.host_inputs = recycle(host);
        workspace.scratch.device_run_inputs = recycle(device);
        result
    }

    fn run_checked(&self, workspace: &mut Workspace, run: &Run<'_>) -> Result<()> {
        self.check_inputs(run)?;
        self.prepare_device_buffers(workspace)?;
        let queue = workspace.queue.take();
        let on_queue = OnQueue::enter(self.device.as_deref(), queue.as_deref())?;
        let mut result = self.run_in_flight(workspace, run);
        if !self.checked_steps.is_empty() {
            // Every run's findings are read (and cleared), also after a failed run, so none is
            // reported by a later run; the run's own error comes first.
            let checked = self.check_after_run();
            if result.is_ok() {
                result = checked;
            }
        }
        drop(on_queue);
        workspace.queue = queue;
        result
    }

    /// Makes the workspace whole (rebuilt, if a kernel panicked in its last run) and allocates
    /// its device buffers and queue on its first run. The uploads of inputs wait for a run that
    /// gives their input on the host: a run that gives its own device tensor there needs none.
    fn prepare_device_buffers(&self, workspace: &mut Workspace) -> Result<()> {
        if workspace.in_flight {
            let on_device_queue = workspace.on_device_queue;
            *workspace = self.workspace()?;
            workspace.on_device_queue = on_device_queue;
        }
        if let (Some(device), true) = (&self.device, workspace.device_buffers.len() != self.device_lengths.len()) {
            let mut buffers: Vec<Option<Box<dyn DeviceBuffer>>> = (self.device_lengths.iter().enumerate())
                .map(|(d, &len)| match (self.device_offsets[d], self.device_io.uploaded_input[d]) {
                    (None, None) if !self.device_io.unused[d] => device.alloc(len).map(Some),
                    // In the block (below), an upload, or no step's.
                    _ => Ok(None),
                })
                .collect::<Result<_>>()?;
            let parts: Vec<(usize, usize)> = (self.device_offsets.iter().zip(&self.device_lengths))
                .filter_map(|(offset, &len)| Some(((*offset)?, len)))
                .collect();
            if !parts.is_empty() {
                let mut within = device.alloc_within(self.device_block_words, &parts)?.into_iter();
                for (d, _) in self.device_offsets.iter().enumerate().filter(|(_, o)| o.is_some()) {
                    buffers[d] = within.next();
                }
                workspace.block_words = self.device_block_words;
            }
            workspace.in_block = self.device_offsets.iter().map(Option::is_some).collect();
            workspace.device_buffers = buffers;
            workspace.queue = if workspace.on_device_queue { device.device_queue()? } else { device.new_queue()? };
        }
        Ok(())
    }

    fn run_in_flight(&self, workspace: &mut Workspace, run: &Run<'_>) -> Result<()> {
        workspace.in_flight = true;
        // One profiling decision for the whole run: the schedule, and the region ranges that
        // executors push from inside their kernels.
        let profiling = self.profiling.load(Ordering::Relaxed);
        let _decision = RunDecision::enter(profiling);
        let schedule = &self.schedules[if profiling { 0 } else { 1 }];
        let result = if schedule.is_empty() {
            self.run_unguarded(workspace, run)
        } else {
            self.run_guarded(schedule, workspace, run)
        };
        // Every step puts its buffers back, even when it fails: the workspace is whole.
        workspace.in_flight = false;
        result
    }

    /// Waits for the run's device work (on the run's queue, which this thread is still on) and
    /// asks each kernel that checks its inputs on the device what it found
    /// ([`DeviceKernel::check_after_run`](crate::core::plan::DeviceKernel::check_after_run)):
    /// the first finding is the run's error.
    fn check_after_run(&self) -> Result<()> {
        if let Some(device) = &self.device {
            device.synchronize()?;
        }
        // Every kernel is asked (each clears what it found); the first finding is returned.
        let mut first = Ok(());
        for &i in &self.checked_steps {
            if let Work::Device(kernel) = &self.steps[i].work {
                let found = kernel.check_after_run().map_err(|e| self.steps[i].named_for_user(e));
                if first.is_ok() {
                    first = found;
                }
            }
        }
        first
    }

    /// An input given on the device: on this plan's device, of its shape, read by device steps
    /// only.
    fn check_device_input(&self, index: usize, tensor: &DeviceTensor) -> Result<()> {
        let placement = |detail: String| Err(Error::InputPlacement { index, detail });
        if self.input_dtypes[index] != tensor.dtype() {
            return Err(Error::InputDType { index, expected: self.input_dtypes[index], got: tensor.dtype() });
        }
        let Some(device) = &self.device else {
            return placement("this plan has no device steps; pass the input on the host".into());
        };
        if !std::ptr::addr_eq(Arc::as_ptr(device), Arc::as_ptr(tensor.device())) {
            let (theirs, ours) = (tensor.device().name(), device.name());
            return placement(if theirs == ours {
                format!(
                    "it is on another device object named `{ours}`, not the one this plan runs on (devices are \
                     the same only as one handle); upload it through the plan's device (`Plan::device`), or \
                     make both from one handle (`CudaDevice::new` returns the process's handle of a GPU)"
                )
            } else {
                format!("it is on `{theirs}`, but this plan runs on `{ours}`; upload it to the plan's device (`Plan::device`)")
            });
        }
        let expected = &self.input_shapes[index];
        if tensor.shape() != expected.as_slice() {
            return Err(Error::InputShape { index, expected: expected.to_vec(), got: tensor.shape().to_vec() });
        }
        if self.device_io.read_on_host[index] {
            return placement(
                "a host step of this plan reads it (an op that runs on the host, or the copy of an input that \
                 is also an output); pass it on the host, or compile with executors that run every step reading it \
                 on the device"
                    .into(),
            );
        }
        // Device buffers hold words (16-bit values two per word, i64 two words each). Reported in
        // elements.
        let numel: usize = expected.iter().product();
        if tensor.buffer().len() < packing::words(tensor.dtype(), numel) {
            return Err(Error::InputLength {
                index,
                shape: expected.to_vec(),
                expected: numel,
                got: packing::values_in(tensor.dtype(), tensor.buffer().len()),
            });
        }
        Ok(())
    }

    /// The run loop without guards (none attached, or profiling off and all are profiling
    /// guards).
    pub(super) fn run_unguarded(&self, workspace: &mut Workspace, run: &Run<'_>) -> Result<()> {
        for (i, step) in self.steps.iter().enumerate() {
            self.run_step(i, step, workspace, run)?;
        }
        Ok(())
    }

    /// The run loop with guards: enters and exits scopes around steps, on this thread. The
    /// stack exits whatever is still entered, innermost first, on error and on panic.
    fn run_guarded(&self, schedule: &Schedule, workspace: &mut Workspace, run: &Run<'_>) -> Result<()> {
        let storage = std::mem::take(&mut workspace.scratch.guard_stack);
        let mut stack = GuardStack::new(&self.scopes, storage);
        let result = self.run_guarded_steps(schedule, &mut stack, workspace, run);
        workspace.scratch.guard_stack = stack.finish();
        result
    }

    #[inline(always)]
    fn run_guarded_steps(
        &self,
        schedule: &Schedule,
        stack: &mut GuardStack<'_>,
        workspace: &mut Workspace,
        run: &Run<'_>,
    ) -> Result<()> {
        let order = &schedule.order;
        let (a, b) = schedule.run_enter;
        stack.enter(&order[a as usize..b as usize]);
        for (i, step) in self.steps.iter().enumerate() {
            let (a, b) = schedule.enter[i];
            if a != b {
                stack.enter(&order[a as usize..b as usize]);
            }
            self.run_step(i, step, workspace, run)?;
            let exits = schedule.exit[i];
            if exits != 0 {
                stack.exit(exits);
            }
        }
        Ok(())
    }

    /// Host inputs: of the plan's shapes, with the data those hold (device inputs are checked
    /// by `check_device_input`).
    pub(super) fn check_inputs(&self, run: &Run<'_>) -> Result<()> {
        for (index, (input, expected)) in run.host.iter().zip(&self.input_shapes).enumerate() {
            if run.device[index].is_some() {
                continue;
            }
            if input.shape != expected.as_slice() {
                return Err(Error::InputShape { index, expected: expected.to_vec(), got: input.shape.to_vec() });
            }
            if input.dtype() != self.input_dtypes[index] {
                return Err(Error::InputDType { index, expected: self.input_dtypes[index], got: input.dtype() });
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

    /// Runs one step; its error as the user meets it ([`Step::named_for_user`]).
    #[inline(always)]
    fn run_step(&self, index: usize, step: &Step, workspace: &mut Workspace, run: &Run<'_>) -> Result<()> {
        self.run_step_work(index, step, workspace, run).map_err(|e| step.named_for_user(e))
    }

    /// Runs one step's work. A narrow step's output is borrowed in place; a wider step's output
    /// buffers are moved out of the workspace for the kernel call and moved back afterwards, also
    /// when the kernel fails.
    #[inline(always)]
    fn run_step_work(&self, index: usize, step: &Step, workspace: &mut Workspace, run: &Run<'_>) -> Result<()> {
        let kernel = match &step.work {
            Work::Host(kernel) => kernel,
            other => return self.run_device_step(index, other, step, workspace, run),
        };
        let inputs = run.host;
        let Workspace { buffers, scratch, .. } = workspace;
        if let Some(narrow) = &step.narrow {
            // The common case, one output and a few inputs: everything on the stack, the
            // output borrowed in place (no step reads the buffer it writes: `Narrow` says so).
            let buffer = narrow.output as usize;
            let count = narrow.count.min(NARROW_INPUTS);
            let slots = &narrow.inputs[..count];
            // Every buffer the step touches is at most `last`: one check for all of them (a
            // workspace of another plan may hold fewer).
            if narrow.last as usize >= buffers.len() {
                return Err(Error::WorkspaceMismatch);
            }
            let storage: *mut Storage = buffers[..].as_mut_ptr();
            if let Some(map) = &narrow.map {
                // SAFETY: `map` is this step's own (a plan's steps are immutable once compiled);
                // the buffers as for the views below (every element at most `last`, the output
                // not among the inputs).
                return unsafe { run_map(map.get(), slots, buffer, storage, inputs) };
            }
            let meta = &self.buffers[buffer];
            let mut views = [MaybeUninit::<TensorRef<'_>>::uninit(); NARROW_INPUTS];
            for (view, &slot) in views.iter_mut().zip(slots) {
                view.write(match slot {
                    Slot::Input(i) => inputs[i as usize],
                    Slot::Buffer(b) => {
                        debug_assert_ne!(b as usize, buffer, "a narrow step reads its own output");
                        // SAFETY: `b` is at most `last`, in bounds (checked above), and is not
                        // `buffer` (a narrow step never reads its output), so this shared
                        // borrow of element `b` and the exclusive one of element `buffer`
                        // below, both from `storage`, are of different elements.
                        let data = unsafe { &*storage.add(b as usize) }.data();
                        TensorRef { shape: &self.buffers[b as usize].shape, data }
                    }
                    // `Narrow::of` takes host slots only (views written so far are `Copy`:
                    // nothing to drop).
                    Slot::Device(_) => return Err(Error::WorkspaceMismatch),
                });
            }
            // SAFETY: the first `count` views were written just above (and `TensorRef` is
            // `Copy`: nothing to drop).
            let views = unsafe { std::slice::from_raw_parts(views.as_ptr().cast::<TensorRef<'_>>(), count) };
            // SAFETY: in bounds (`buffer` is at most `last`), and no view borrows element `buffer`.
            let out = unsafe { &mut *storage.add(buffer) };
            let mut outs = [TensorMut { shape: &meta.shape, data: out.data_mut() }];
            return kernel.run(views, &mut outs);
        }
        // Wider steps: lists lent by the workspace, sized for the plan's widest step.
        let mut taken = std::mem::take(&mut scratch.taken);
        for &b in &step.outputs {
            taken.push(std::mem::take(&mut buffers[b as usize]));
        }
        let result = {
            let mut views = recycle(std::mem::take(&mut scratch.input_views));
            self.input_views(&mut views, step, buffers, inputs);
            let mut outs: Vec<TensorMut<'_>> = recycle(std::mem::take(&mut scratch.output_views));
            for (data, &b) in taken.iter_mut().zip(&step.outputs) {
                outs.push(TensorMut { shape: &self.buffers[b as usize].shape, data: data.data_mut() });
            }
            let result = kernel.run(&views, &mut outs);
            scratch.input_views = recycle(views);
            scratch.output_views = recycle(outs);
            result
        };
        for (data, &b) in taken.drain(..).zip(&step.outputs) {
            buffers[b as usize] = data;
        }
        scratch.taken = taken;
        result
    }

    #[inline(always)]
    fn input_views<'v>(
        &'v self,
        views: &mut impl Extend<TensorRef<'v>>,
        step: &Step,
        buffers: &'v [Storage],
        inputs: &[TensorRef<'v>],
    ) {
        views.extend(step.inputs.iter().map(|&slot| self.input_view(slot, buffers, inputs)));
    }

    #[inline(always)]
    fn input_view<'v>(&'v self, slot: Slot, buffers: &'v [Storage], inputs: &[TensorRef<'v>]) -> TensorRef<'v> {
        match slot {
            Slot::Input(i) => inputs[i as usize],
            Slot::Buffer(b) => TensorRef { shape: &self.buffers[b as usize].shape, data: buffers[b as usize].data() },
            // Compilation gives host kernels host slots only (downloads come first).
            Slot::Device(_) => TensorRef { shape: &[], data: Data::F32(&[]) },
        }
    }

    /// Runs a device kernel or a transfer.
    #[inline(never)]
    fn run_device_step(
        &self,
        index: usize,
        work: &Work,
        step: &Step,
        workspace: &mut Workspace,
        run: &Run<'_>,
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
                let out = step.outputs[0] as usize;
                let source: Data<'_> = match step.inputs[0] {
                    // Given on the device: read there, nothing to upload; unless a step writes
                    // an update over it, which gets the input's memory (lent) or a copy.
                    Slot::Input(i) if run.device[i as usize].is_some() => {
                        if !self.device_io.written_over[out] || run.lent(i as usize) {
                            return Ok(());
                        }
                        let given = run.device[i as usize].ok_or_else(missing)?;
                        let target = match &mut workspace.device_buffers[out] {
                            Some(buffer) => buffer,
                            empty => empty.insert(device.alloc(self.device_lengths[out])?),
                        };
                        return device.copy(given, &mut **target);
                    }
                    Slot::Input(i) => run.host[i as usize].data,
                    Slot::Buffer(b) => workspace.buffers[b as usize].data(),
                    Slot::Device(_) => return Err(missing()),
                };
                let target = match &mut workspace.device_buffers[out] {
                    Some(buffer) => buffer,
                    // The first run that gives this input on the host.
                    empty => empty.insert(device.alloc(self.device_lengths[out])?),
                };
                packing::upload(&**device, source, &mut **target, &mut workspace.scratch.packed)
            }
            Work::Download if run.outputs_on_device && self.device_io.output_download[index] => Ok(()),
            Work::Download => {
                let d = device_slot(&step.inputs[0]).ok_or_else(missing)?;
                let source = self.device_buffer(d, &workspace.device_buffers, run).ok_or_else(missing)?;
                let target = workspace.buffers[step.outputs[0] as usize].data_mut();
                packing::download(&**device, source, target, &mut workspace.scratch.packed)
            }
            Work::Device(kernel) => {
                let Workspace { device_buffers, scratch, .. } = workspace;
                // Taken out for the call and always put back, whatever happens in between.
                let mut taken = std::mem::take(&mut scratch.device_taken);
                taken.extend(step.outputs.iter().map(|&o| device_buffers[o as usize].take()));
                let mut views: Vec<&dyn DeviceBuffer> = recycle(std::mem::take(&mut scratch.device_inputs));
                let mut outs: Vec<&mut dyn DeviceBuffer> = recycle(std::mem::take(&mut scratch.device_outputs));
                let result = 'run: {
                    for (k, slot) in step.inputs.iter().enumerate() {
                        if step.in_place.iter().any(|&(input, _)| input as usize == k) {
                            // Its value is in the output the kernel writes over it.
                            views.push(&VACANT);
                            continue;
                        }
                        match device_slot(slot).and_then(|d| self.device_buffer(d, device_buffers, run)) {
                            Some(buffer) => views.push(buffer),
                            None => break 'run Err(missing()),
                        }
                    }
                    for buffer in taken.iter_mut() {
                        match buffer.as_deref_mut() {
                            Some(buffer) => outs.push(buffer),
                            None => break 'run Err(missing()),
                        }
                    }
                    kernel.run(&views, &mut outs)
                };
                scratch.device_inputs = recycle(views);
                scratch.device_outputs = recycle(outs);
                for (buffer, &o) in taken.drain(..).zip(&step.outputs) {
                    device_buffers[o as usize] = buffer;
                }
                scratch.device_taken = taken;
                result
            }
            Work::Host(_) => Err(missing()),
        }
    }

    /// Device buffer `d` for this run: the caller's, where it is the upload of an input given
    /// on the device, else the workspace's.
    #[inline(always)]
    fn device_buffer<'b>(
        &self,
        d: usize,
        buffers: &'b [Option<Box<dyn DeviceBuffer>>],
        run: &Run<'b>,
    ) -> Option<&'b dyn DeviceBuffer> {
        if self.device_io.written_over[d] {
            // The input's memory lent for the run, or a copy of it.
            return buffers[d].as_deref();
        }
        match self.device_io.uploaded_input[d].and_then(|i| run.device[i as usize]) {
            Some(given) => Some(given),
            None => buffers[d].as_deref(),
        }
    }
}

/// This thread's device work goes to a workspace's queue while it lives (see
/// [`Device::enter_queue`]); leaving it, also while unwinding, orders the device's own queue
/// after that work.
pub(super) struct OnQueue<'d> {
    entered: Option<(&'d dyn Device, &'d dyn DeviceQueue)>,
}

impl<'d> OnQueue<'d> {
    pub(super) fn enter(device: Option<&'d dyn Device>, queue: Option<&'d dyn DeviceQueue>) -> Result<Self> {
        match (device, queue) {
            (Some(device), Some(queue)) => {
                device.enter_queue(queue)?;
                Ok(Self { entered: Some((device, queue)) })
            }
            _ => Ok(Self { entered: None }),
        }
    }
}

impl Drop for OnQueue<'_> {
    fn drop(&mut self) {
        if let Some((device, queue)) = self.entered.take() {
            // A failure here leaves the device's queue unordered after the run: nothing more
            // can be done from a drop; the next call on the device reports the device's error.
            let _ = device.leave_queue(queue);
        }
    }
}

/// One run's inputs, wherever they are, and where its outputs go.
pub(super) struct Run<'i> {
    /// Host inputs (an empty view where the input is on the device).
    host: &'i [TensorRef<'i>],
    /// Device inputs, by input index.
    pub(super) device: &'i [Option<&'i dyn DeviceBuffer>],
    /// Whether outputs computed on the device stay there.
    outputs_on_device: bool,
    /// By input index (empty: none): whether the input lent its memory to the workspace.
    lent: &'i [bool],
}

impl Run<'_> {
    /// Whether input `i` lent its memory to the workspace for this run.
    fn lent(&self, i: usize) -> bool {
        self.lent.get(i).copied().unwrap_or(false)
    }
}

/// The outputs of one run made with [`Plan::run_on_device`]: those computed on the device are
/// still there (and may still be being computed); reading one on the host waits for the device.
pub struct DeviceOutputs<'w> {
    pub(super) plan: &'w Plan,
    pub(super) workspace: &'w Workspace,
}

impl<'w> DeviceOutputs<'w> {
    /// Number of outputs.
    pub fn len(&self) -> usize {
        self.plan.outputs.len()
    }

    /// Whether there are no outputs.
    pub fn is_empty(&self) -> bool {
        self.plan.outputs.is_empty()
    }

    /// The shape of the `i`-th output, or `None` past the end.
    pub fn shape(&self, i: usize) -> Option<&'w [usize]> {
        let buffer = *self.plan.outputs.get(i)? as usize;
        Some(&self.plan.buffers[buffer].shape)
    }

    /// The device memory of the `i`-th output, if a device step computed it (else it is on the
    /// host: see [`to_host`](Self::to_host)), and it was not written back into the input it
    /// updates ([`Plan::run_updating_on_device`]: read that input).
    pub fn device_buffer(&self, i: usize) -> Option<&'w dyn DeviceBuffer> {
        if self.workspace.exchanged.get(i).copied().unwrap_or(false) {
            return None;
        }
        let d = (*self.plan.device_io.output_on_device.get(i)?)? as usize;
        self.workspace.device_buffers.get(d)?.as_deref()
    }

    /// The `i`-th output on the host: downloaded (waiting for the device) if a device step
    /// computed it, else copied from the workspace.
    ///
    /// # Errors
    /// [`Error::NoSuchOutput`] past the end; [`Error::InvalidUpdate`] for an output that
    /// [`Plan::run_updating_on_device`] wrote back into its input (read that input); the
    /// device's copy error.
    pub fn to_host(&self, i: usize) -> Result<Tensor> {
        let shape = self.shape(i).ok_or(Error::NoSuchOutput { index: i, outputs: self.len() })?;
        if self.workspace.exchanged.get(i).copied().unwrap_or(false) {
            return Err(Error::InvalidUpdate {
                detail: format!("output {i} was written back into the input it updates; read that input"),
            });
        }
        match (self.device_buffer(i), &self.plan.device) {
            (Some(buffer), Some(device)) => {
                download(&**device, buffer, shape, self.plan.buffers[self.plan.outputs[i] as usize].dtype)
            }
            _ => Ok(Outputs { plan: self.plan, workspace: self.workspace }
                .get(i)
                .map(|t| t.to_tensor())
                .unwrap_or_else(|| Tensor::zeros(shape))),
        }
    }
}
