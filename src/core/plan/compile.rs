//! Compiling a trace into a `Plan`.
//!
//! Compilation does all the per-op work once: it picks an executor per bound symbol, lets it
//! build a kernel, and assigns every intermediate value a buffer slot. Running is then a loop
//! over prepared steps that allocates nothing.

use std::fmt;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use smallvec::SmallVec;

use super::device::{Device, DeviceKernel};
use super::executor::{kernel_fn, Executor, Kernel, MapKernel, OpView, RegionRange, RegionRangeParts};
use super::guard_schedule::{prepare_scopes, range_map, schedules, CompiledNode, EmittedRegionRange, Schedule, Scope};
use super::one_per_scope::{emitted_domain, ignored_emissions, ScopeGuards};
use super::range_filter::RangeFilter;
use super::range_map::RangeMap;
use super::scope_details::DetailsOf;
use super::workspace::Workspace;
use crate::core::guards::{Attachment, DroppedGuard, GuardSite, Level, ScopeDetails};
use crate::core::ir::prims;
use crate::core::ir::{BoundSymbol, DType, DimsDisplay, Shape, TensorMeta, Trace, ValueId};
use crate::core::options::Audience;
use crate::error::{Error, Result};
use std::sync::atomic::AtomicBool;

/// Where a value lives while a plan runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Slot {
    /// The `i`-th input of the run (borrowed from the caller, never copied).
    Input(u32),
    /// The `i`-th host buffer of the workspace.
    Buffer(u32),
    /// The `i`-th device buffer of the workspace.
    Device(u32),
}

/// What a step does.
pub(crate) enum Work {
    /// A host kernel: inputs are host slots, outputs host buffers.
    Host(Box<dyn Kernel>),
    /// A device kernel: inputs are device slots, outputs device buffers.
    Device(Box<dyn DeviceKernel>),
    /// Host slot (input 0) to device buffer (output 0).
    Upload,
    /// Device slot (input 0) to host buffer (output 0).
    Download,
}

/// One compiled bound symbol, or a transfer. (In this order: what the run loop reads of a
/// narrow step, `work` and `narrow`, is at the front, in the step's first cache line or two.)
#[repr(C)]
pub(crate) struct Step {
    pub work: Work,
    /// The step's slots inline, where it is a [`Narrow`] one; set once compilation has placed
    /// every buffer ([`Step::settle`]).
    pub narrow: Option<Narrow>,
    pub inputs: SmallVec<[Slot; 4]>,
    pub outputs: SmallVec<[u32; 2]>,
    /// `t3 = add(t1, t2)`, for listings and errors.
    pub line: String,
    pub executor: usize,
    /// `(input, output)` positions where the kernel writes the output over the input
    /// ([`DeviceKernel::in_place`]): the run hands it an empty buffer at `input`.
    pub in_place: Vec<(u32, u32)>,
    /// The composite whose decomposition this step runs (the innermost, where composites
    /// nest), or the composite it runs whole, if any: ids out of range are reported as given
    /// to it, the op the user applied ([`Step::named_for_user`]).
    pub within: Option<std::sync::Arc<str>>,
}

impl Step {
    /// A step of `work` from `inputs` to `outputs`, run by `executor` (`line` for listings).
    pub fn new(
        work: Work,
        inputs: SmallVec<[Slot; 4]>,
        outputs: SmallVec<[u32; 2]>,
        line: String,
        executor: usize,
    ) -> Self {
        Self { work, inputs, outputs, line, executor, in_place: Vec::new(), narrow: None, within: None }
    }

    /// `error`, from this step, as the user meets it: an id out of range in a step that runs a
    /// composite's decomposition (`cross_entropy`'s `gather_last` on the CPU) names the
    /// composite, whose input the ids are, as where an executor runs the composite whole.
    pub fn named_for_user(&self, error: Error) -> Error {
        match (error, &self.within) {
            (Error::IndexOutOfRange { index, position, bound, .. }, Some(composite)) => {
                Error::IndexOutOfRange { symbol: composite.to_string(), index, position, bound }
            }
            (error, _) => error,
        }
    }

    /// Records the step's final slots inline where it is [`Narrow`]: called once no pass of
    /// the compiler renames its slots any more.
    /// `buffers` and `inputs` are the plan's buffers and inputs, to tell whether the step can
    /// run as a map ([`Narrow::map`]).
    pub fn settle(&mut self, buffers: &[TensorMeta], inputs: &[TensorMeta]) {
        self.narrow = Narrow::of(self, buffers, inputs);
    }
}

/// Inputs a [`Narrow`] step holds inline.
pub(crate) const NARROW_INPUTS: usize = 4;

/// A host step with one output and at most [`NARROW_INPUTS`] inputs (almost every op) that
/// reads no buffer it writes, its slots held inline: the run loop reads them with no length or
/// spill checks, builds the kernel's views on the stack and lends the output buffer in place
/// (the dispatch benchmark's 1-element ops spent most of their time there).
/// (Neither `Clone` nor `Copy`: its [`MapRef`] must stay in the step that owns the kernel.)
#[derive(Debug)]
pub(crate) struct Narrow {
    /// The output's buffer.
    pub output: u32,
    /// Inputs (at most [`NARROW_INPUTS`]); the first `count` of `inputs` are the step's.
    pub count: usize,
    pub inputs: [Slot; NARROW_INPUTS],
    /// The largest buffer it reads or writes: a workspace holding it holds them all.
    pub last: u32,
    /// The kernel's map, where it is one ([`Kernel::as_map`]) and every input and the output
    /// are `f32` of one length: the run loop calls it instead of the kernel.
    pub map: Option<MapRef>,
}

/// The [`MapKernel`] a step's own kernel lends ([`Kernel::as_map`]), found once at compile
/// time: the run loop makes one virtual call per map step, not two. It is held only in the
/// [`Narrow`] of the step that owns the kernel (neither is `Clone`), and reading it is
/// `unsafe`: the step's `work` must not have been replaced since [`Step::settle`].
pub(crate) struct MapRef(NonNull<dyn MapKernel>);

// SAFETY: it stands for a `&dyn MapKernel`, which is `Send` and `Sync` (`MapKernel` requires
// both of the type it is implemented for).
unsafe impl Send for MapRef {}
unsafe impl Sync for MapRef {}

impl MapRef {
    /// The map `kernel` lends, if it lends one. It points into `kernel`'s own memory (the
    /// heap memory of the `Box` a [`Work::Host`] holds), which does not move when the step
    /// does.
    fn of(kernel: &dyn Kernel) -> Option<Self> {
        let map: NonNull<dyn MapKernel + '_> = NonNull::from(kernel.as_map()?);
        // SAFETY: this erases the borrow of `kernel` only. Every `MapRef` is held in the
        // `Narrow` of the step that owns the kernel, the step's `work` is never replaced
        // once the step is settled, and a plan's steps are not mutated after compilation:
        // the map lives as long as the `MapRef`.
        Some(Self(unsafe { std::mem::transmute::<NonNull<dyn MapKernel + '_>, NonNull<dyn MapKernel>>(map) }))
    }

    /// The map, borrowed for as long as the step that holds it.
    ///
    /// # Safety
    /// `self` is the `map` of a step's [`Narrow`], and that step's `work` is the one
    /// [`Step::settle`] found the map in (no code replaces a settled step's `work`; a plan's
    /// steps are immutable once compiled).
    #[inline(always)]
    pub unsafe fn get(&self) -> &dyn MapKernel {
        // SAFETY: the caller's promise: the kernel it points into is alive and unmoved.
        unsafe { self.0.as_ref() }
    }
}

impl fmt::Debug for MapRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("MapRef")
    }
}

impl Narrow {
    fn of(step: &Step, buffers: &[TensorMeta], plan_inputs: &[TensorMeta]) -> Option<Self> {
        let (Work::Host(kernel), &[output]) = (&step.work, &step.outputs[..]) else {
            return None;
        };
        let count = step.inputs.len();
        if step.inputs.iter().any(|&s| s == Slot::Buffer(output) || matches!(s, Slot::Device(_))) {
            return None;
        }
        let mut inputs = [Slot::Input(0); NARROW_INPUTS];
        inputs.get_mut(..count)?.copy_from_slice(&step.inputs);
        let read = step.inputs.iter().filter_map(|s| if let Slot::Buffer(b) = *s { Some(b) } else { None });
        let last = read.fold(output, u32::max);
        let meta = |slot: Slot| match slot {
            Slot::Input(i) => plan_inputs.get(i as usize),
            Slot::Buffer(b) => buffers.get(b as usize),
            Slot::Device(_) => None,
        };
        let out = buffers.get(output as usize)?;
        let numel = out.shape.iter().product::<usize>();
        let all_f32_of_one_length = out.dtype == DType::F32
            && step.inputs.iter().all(|&slot| {
                meta(slot).is_some_and(|m| m.dtype == DType::F32 && m.shape.iter().product::<usize>() == numel)
            });
        let map = if all_f32_of_one_length { MapRef::of(kernel.as_ref()) } else { None };
        Some(Self { output, count, inputs, last, map })
    }
}

/// A trace compiled against an ordered list of executors, ready to run many times.
///
/// A plan owns everything it needs (it does not borrow the trace or its arena), is
/// `Send + Sync`, and may run from several threads at once: each run takes its own
/// [`Workspace`] from a pool (see [`Plan::run`]) or uses one the caller holds
/// ([`Plan::run_with`]). In steady state a run allocates nothing per bound symbol.
///
/// ```
/// use boundscope::{executors::CpuReference, Arena, Plan, Registry, Tensor, TraceBuilder};
///
/// let registry = Registry::with_builtins();
/// let arena = Arena::new();
/// let mut b = TraceBuilder::new(&arena, &registry);
/// let a = b.input(&[2, 2]).unwrap();
/// let x = b.mul(a, a).unwrap();
/// let y = b.add_scalar(x, 1.0).unwrap();
/// b.output(y).unwrap();
/// let trace = b.finish().unwrap();
///
/// let plan = Plan::compile(&trace, &[CpuReference::shared()]).unwrap();
/// let input = Tensor::new(&[2, 2], vec![1.0, 2.0, 3.0, 4.0]).unwrap();
/// let out = plan.run(&[&input]).unwrap();
/// assert_eq!(out[0].to_f32_vec(), &[2.0, 5.0, 10.0, 17.0]);
///
/// // Reuse one workspace: no allocation per run.
/// let mut ws = plan.workspace().unwrap();
/// for _ in 0..3 {
///     let outs = plan.run_with(&mut ws, &[input.view()]).unwrap();
///     assert_eq!(outs.get(0).unwrap().values::<f32>().unwrap()[3], 17.0);
/// }
/// ```
pub struct Plan {
    pub(crate) id: u64,
    pub(crate) steps: Vec<Step>,
    /// The steps whose device kernel checks its inputs after each run
    /// ([`DeviceKernel::checks_after_run`]).
    pub(crate) checked_steps: Vec<usize>,
    pub(crate) executor_names: Vec<String>,
    pub(crate) input_shapes: Vec<Shape>,
    pub(crate) input_dtypes: Vec<DType>,
    /// Each host buffer's shape and dtype (one vector, so that the run loop finds both with
    /// one bounds check).
    pub(crate) buffers: Vec<TensorMeta>,
    /// The device of the plan's device executors, and the lengths of its buffers.
    pub(crate) device: Option<Arc<dyn Device>>,
    pub(crate) device_lengths: Vec<usize>,
    /// Per device buffer: its offset in the workspace's shared block, if it lives there (see
    /// `buffer_reuse`); and the block's length in words.
    pub(crate) device_offsets: Vec<Option<usize>>,
    pub(crate) device_block_words: usize,
    /// Which inputs and outputs may stay on the device.
    pub(crate) device_io: DeviceIo,
    pub(crate) outputs: Vec<u32>,
    /// In-place updates: (input index, output index).
    pub(crate) updates: Vec<(u32, u32)>,
    pub(crate) pool: Mutex<Vec<Workspace>>,
    pub(crate) scopes: Vec<Scope>,
    /// `[profiling on, profiling off]`.
    pub(crate) schedules: [Schedule; 2],
    /// The NVTX ranges of one run, `[profiling on, profiling off]`.
    pub(crate) range_maps: [RangeMap; 2],
    /// Its widest step and deepest guard nesting, which size a workspace's run-loop lists.
    pub(crate) widths: Widths,
    /// What the plan reports about its guards (merged NVTX settings that conflicted).
    pub(crate) notes: Vec<String>,
    pub(crate) profiling: Arc<AtomicBool>,
    pub(crate) dropped_guards: Vec<DroppedGuard>,
    /// `name=value` of developer options the plan was built with (listed in its header).
    pub(crate) developer_options: Vec<String>,
    /// Options that were set but that neither the runtime nor any executor of the plan reads.
    pub(crate) unused_options: Vec<String>,
}

/// Where a plan's inputs and outputs may live on its device: an input that only device steps
/// read may be given on the device (its upload is then skipped), and an output that a device
/// step computes may be left there (its download is then skipped).
#[derive(Clone, Debug, Default)]
pub(crate) struct DeviceIo {
    /// Per device buffer: the trace input it is the upload of, if it is one.
    pub uploaded_input: Vec<Option<u32>>,
    /// Per input: whether a host step reads it (then it must be given on the host).
    pub read_on_host: Vec<bool>,
    /// Per output: the device buffer holding it, when a device step computes it.
    pub output_on_device: Vec<Option<u32>>,
    /// Per step: whether it is a download that only brings an output to the host.
    pub output_download: Vec<bool>,
    /// Per device buffer: whether a step writes an update over it, the upload of the input it
    /// updates (see `in_place`). Steps read it from the workspace, also when the run gives
    /// the input on the device: the run lends the input's memory to the workspace, or copies it.
    pub written_over: Vec<bool>,
    /// Per device buffer: whether no step reads or writes it (an update's, merged into its
    /// input's upload): workspaces allocate none.
    pub unused: Vec<bool>,
}

impl DeviceIo {
    fn of(
        steps: &[Step],
        inputs: usize,
        device_lengths: &[usize],
        output_downloads: &[(usize, u32)],
        output_on_device: Vec<Option<u32>>,
    ) -> Self {
        let mut io = DeviceIo {
            uploaded_input: vec![None; device_lengths.len()],
            read_on_host: vec![false; inputs],
            output_on_device,
            output_download: vec![false; steps.len()],
            written_over: vec![false; device_lengths.len()],
            unused: vec![true; device_lengths.len()],
        };
        for step in steps {
            for slot in &step.inputs {
                if let Slot::Device(d) = *slot {
                    io.unused[d as usize] = false;
                }
            }
            if !matches!(step.work, Work::Host(_) | Work::Download) {
                for &o in &step.outputs {
                    io.unused[o as usize] = false;
                }
            }
            for &(_, j) in &step.in_place {
                io.written_over[step.outputs[j as usize] as usize] = true;
            }
            match (&step.work, step.inputs.first()) {
                (Work::Upload, Some(&Slot::Input(i))) => io.uploaded_input[step.outputs[0] as usize] = Some(i),
                (Work::Host(_), _) => {
                    for slot in &step.inputs {
                        if let Slot::Input(i) = *slot {
                            io.read_on_host[i as usize] = true;
                        }
                    }
                }
                _ => {}
            }
        }
        for &(step, _) in output_downloads {
            io.output_download[step] = true;
        }
        io
    }
}

/// The widest step (tensor inputs, outputs) and the deepest guard nesting of a plan: what a
/// workspace's run-loop lists must hold so that no run allocates.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Widths {
    pub inputs: usize,
    pub outputs: usize,
    pub guard_depth: usize,
}

static NEXT_PLAN_ID: AtomicU64 = AtomicU64::new(1);

impl Plan {
    /// Compiles `trace` against `executors`, tried in order for each bound symbol.
    ///
    /// A composite that no executor claims is replaced by its decomposition; a prim that no
    /// executor claims is an error.
    ///
    /// # Errors
    /// [`Error::MalformedTrace`] if the trace does not verify; [`Error::DeviceMismatch`] for
    /// executors on two devices; [`Error::ExecutorName`] for two executors of the list sharing a
    /// name, or one without a name; [`Error::NoExecutor`] naming the symbol and the executors
    /// tried; or an executor's own compile error.
    pub fn compile(trace: &Trace<'_>, executors: &[Arc<dyn Executor>]) -> Result<Plan> {
        Self::compile_filtered(trace, executors, &RangeFilter::new())
    }

    /// Like [`compile`](Self::compile), preparing only the NVTX ranges that `filter` admits
    /// (see [`RangeFilter`]): the others are never prepared, cost nothing per op, are absent
    /// from the [`range_map`](Self::range_map), and executors that push their own region ranges
    /// are given none to push where the filter leaves a region out. Parts of the filter that
    /// match no range of the plan are listed in its [`notes`](Self::notes).
    ///
    /// ```
    /// use boundscope::executors::{CpuFusion, CpuReference};
    /// use boundscope::guards::Level;
    /// use boundscope::passes::{FuseRegions, Pass, ProfileOps};
    /// use boundscope::{Arena, Plan, PushedBy, RangeFilter, Registry, TraceBuilder};
    /// let registry = Registry::with_builtins();
    /// let arena = Arena::new();
    /// let mut b = TraceBuilder::new(&arena, &registry);
    /// let x = b.input(&[64]).unwrap();
    /// let e = b.exp(x).unwrap();
    /// let y = b.neg(e).unwrap();
    /// b.output(y).unwrap();
    /// let profiled = ProfileOps::new().run(&b.finish().unwrap(), &arena).unwrap();
    /// let fused = FuseRegions::new(CpuFusion::shared()).run(&profiled, &arena).unwrap();
    /// let executors = [CpuFusion::shared(), CpuReference::shared()];
    /// // Regions only: CpuFusion still pushes its region's range.
    /// let regions = RangeFilter::new().levels(&[Level::Region]);
    /// let plan = Plan::compile_filtered(&fused, &executors, &regions).unwrap();
    /// assert_eq!(plan.range_map().len(), 1);
    /// assert_eq!(plan.range_map().ranges()[0].pushed_by, PushedBy::Executor("cpu_fusion".into()));
    /// // Ops only: this plan has none (its ops are fused), and says so.
    /// let ops = RangeFilter::new().levels(&[Level::Op]);
    /// let plan = Plan::compile_filtered(&fused, &executors, &ops).unwrap();
    /// assert!(plan.range_map().is_empty());
    /// assert!(plan.notes().iter().any(|n| n.contains("level `op` matches no range")));
    /// ```
    ///
    /// # Errors
    /// As for [`compile`](Self::compile).
    pub fn compile_filtered(trace: &Trace<'_>, executors: &[Arc<dyn Executor>], filter: &RangeFilter) -> Result<Plan> {
        trace.verify()?;
        // One device per plan: its steps are ordered on that device's queue only.
        let mut devices = executors.iter().filter_map(|e| e.device().map(|d| (e.name(), d)));
        if let Some((first, device)) = devices.next() {
            if let Some((other, d)) = devices.find(|(_, d)| !std::ptr::addr_eq(Arc::as_ptr(d), Arc::as_ptr(&device))) {
                return Err(Error::DeviceMismatch {
                    first: first.to_string(),
                    first_device: device.name().to_string(),
                    second: other.to_string(),
                    second_device: d.name().to_string(),
                });
            }
        }
        check_executor_names(executors)?;
        let id = NEXT_PLAN_ID.fetch_add(1, Ordering::Relaxed);
        let mut compiler = Compiler {
            trace,
            details_of: DetailsOf::new(trace, id),
            executors,
            value_slots: vec![None; trace.value_count()],
            device_slots: vec![None; trace.value_count()],
            steps: Vec::with_capacity(trace.len()),
            buffers: Vec::new(),
            device: executors.iter().find_map(|e| e.device()),
            device_lengths: Vec::new(),
            output_downloads: Vec::new(),
            filter,
        };
        for (i, &input) in trace.inputs().iter().enumerate() {
            compiler.value_slots[input.index()] = Some(Slot::Input(i as u32));
        }
        let profiling = Arc::new(AtomicBool::new(true));
        let mut nodes = Vec::with_capacity(trace.len());
        for (position, bsym) in trace.bound_symbols().iter().enumerate() {
            nodes.push(compiler.compile_top_level(position, bsym, &profiling)?);
        }
        // Updates that a device kernel can write over their input's upload take its buffer.
        let pairs: Vec<(u32, u32)> = trace
            .updates()
            .iter()
            .filter_map(|&(input, value)| {
                Some((compiler.device_slots[input.index()]?, compiler.device_slots[value.index()]?))
            })
            .collect();
        for (update, upload) in
            super::in_place::write_updates_over_inputs(&mut compiler.steps, &pairs, &compiler.device_lengths)
        {
            for slot in compiler.device_slots.iter_mut().filter(|d| **d == Some(update)) {
                *slot = Some(upload);
            }
        }
        let mut outputs = Vec::with_capacity(trace.outputs().len());
        let mut output_on_device = Vec::with_capacity(trace.outputs().len());
        for &value in trace.outputs() {
            outputs.push(compiler.output_buffer(value)?);
            // Every occurrence of an output brought to the host by an output download (the
            // same value returned twice shares the first one's).
            let device = compiler.device_slots[value.index()];
            let downloaded = compiler.output_downloads.iter().any(|&(_, d)| Some(d) == device);
            output_on_device.push(device.filter(|_| downloaded));
        }
        // Values whose lifetimes do not overlap share device buffers; what callers see or
        // swap (outputs, uploads) keeps its own.
        let mut exclusive: Vec<u32> = trace.outputs().iter().filter_map(|v| compiler.device_slots[v.index()]).collect();
        exclusive.extend(compiler.output_downloads.iter().map(|&(_, d)| d));
        let within_one_block = compiler.device.as_ref().is_some_and(|d| d.allocates_within());
        let layout = super::buffer_reuse::share_device_buffers(
            &mut compiler.steps,
            &compiler.device_lengths,
            &exclusive,
            within_one_block,
        );
        let renamed = layout.renamed;
        compiler.device_lengths = layout.lengths;
        for (_, d) in compiler.output_downloads.iter_mut() {
            *d = renamed[*d as usize];
        }
        for d in output_on_device.iter_mut().flatten() {
            *d = renamed[*d as usize];
        }
        let device_io = DeviceIo::of(
            &compiler.steps,
            trace.inputs().len(),
            &compiler.device_lengths,
            &compiler.output_downloads,
            output_on_device,
        );
        let input_shapes: Vec<Shape> =
            trace.inputs().iter().map(|&v| compiler.shape(v).map(Shape::from_slice)).collect::<Result<_>>()?;
        let input_dtypes: Vec<DType> = trace.inputs().iter().map(|&v| compiler.dtype(v)).collect();
        // Guards surround the steps of the trace's bound symbols; a copy step for an output that
        // is an input comes after all of them and stays outside every op's scope.
        let executor_names: Vec<&str> =
            compiler.steps.iter().map(|s| executors.get(s.executor).map_or("runtime", |e| e.name())).collect();
        let (scopes, mut dropped_guards, mut notes) =
            prepare_scopes(trace, &nodes, &executor_names, filter, &compiler.details_of)?;
        // What passes did to the trace's scopes (cut around regions, split, gone).
        notes.extend(trace.scope_notes().iter().cloned());
        if !trace.updates().is_empty() {
            notes.push(format!(
                "the plan updates {} input(s) in place; only `Plan::run_updating` and `Plan::run_updating_on_device` \
                 write them back (other runs leave the inputs as they are)",
                trace.updates().len()
            ));
        }
        // What the runtime does not use of the executors' declared emissions.
        for executor in executors {
            notes.extend(ignored_emissions(executor.name(), executor.emits()));
        }
        dropped_guards.extend(trace.dropped_guards().iter().cloned());
        let schedules = schedules(&scopes, compiler.steps.len());
        let range_maps =
            [range_map(&scopes, &schedules[0], &nodes, true), range_map(&scopes, &schedules[1], &nodes, false)];
        let input_metas: Vec<TensorMeta> =
            input_shapes.iter().zip(&input_dtypes).map(|(s, &d)| TensorMeta { dtype: d, shape: s.clone() }).collect();
        for step in compiler.steps.iter_mut() {
            step.settle(&compiler.buffers, &input_metas);
        }
        let widths = Widths {
            inputs: compiler.steps.iter().map(|s| s.inputs.len()).max().unwrap_or(0),
            outputs: compiler.steps.iter().map(|s| s.outputs.len()).max().unwrap_or(0),
            guard_depth: schedules.iter().map(Schedule::max_depth).max().unwrap_or(0),
        };
        Ok(Plan {
            id,
            widths,
            scopes,
            schedules,
            range_maps,
            notes,
            profiling,
            dropped_guards,
            developer_options: configured_developer_options(executors, &compiler.steps),
            unused_options: Vec::new(),
            checked_steps: compiler
                .steps
                .iter()
                .enumerate()
                .filter(|(_, step)| matches!(&step.work, Work::Device(kernel) if kernel.checks_after_run()))
                .map(|(i, _)| i)
                .collect(),
            steps: compiler.steps,
            executor_names: executors.iter().map(|e| e.name().to_string()).collect(),
            input_shapes,
            input_dtypes,
            buffers: compiler.buffers,
            device: compiler.device,
            device_lengths: compiler.device_lengths,
            device_offsets: layout.offsets,
            device_block_words: layout.block_words,
            device_io,
            outputs,
            updates: trace
                .updates()
                .iter()
                .filter_map(|&(input, value)| {
                    let i = trace.inputs().iter().position(|&v| v == input)?;
                    let o = trace.outputs().iter().position(|&v| v == value)?;
                    Some((i as u32, o as u32))
                })
                .collect(),
            pool: Mutex::new(Vec::new()),
        })
    }

    /// Like [`compile`](Self::compile), recording the options it was built with. The header
    /// lists the developer options in force: those the executors that run steps of the plan
    /// were configured with (as [`compile`](Self::compile) lists them too) and the runtime's.
    /// Options that had no effect (no executor running steps, nor the runtime, reads them, or
    /// the executor that reads them was configured otherwise) are reported by
    /// [`unused_options`](Self::unused_options).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use boundscope::executors::{CpuFusion, CpuReference};
    /// use boundscope::passes::{FuseRegions, Pass};
    /// use boundscope::{options::Options, Arena, Plan, Registry, TraceBuilder};
    /// let registry = Registry::with_builtins();
    /// let arena = Arena::new();
    /// let mut b = TraceBuilder::new(&arena, &registry);
    /// let x = b.input(&[4]).unwrap();
    /// let e = b.exp(x).unwrap();
    /// let y = b.neg(e).unwrap();
    /// b.output(y).unwrap();
    /// // A region for CpuFusion to run.
    /// let trace = FuseRegions::new(CpuFusion::shared()).run(&b.finish().unwrap(), &arena).unwrap();
    /// let mut options = Options::new();
    /// options.set_developer("cpu_fusion.block_size", 2048).unwrap();
    /// // No executor of the list reads it: unused, and not listed as in force.
    /// let plan = Plan::compile_with_options(&trace, &[CpuReference::shared()], &options).unwrap();
    /// assert!(!plan.to_string().contains("# developer options"));
    /// assert_eq!(plan.unused_options(), &["cpu_fusion.block_size".to_string()]);
    /// // CpuFusion configured from the options: in force.
    /// let fusion = Arc::new(CpuFusion::from_options(&options).unwrap());
    /// let plan = Plan::compile_with_options(&trace, &[fusion, CpuReference::shared()], &options).unwrap();
    /// assert!(plan.to_string().contains("# developer options: cpu_fusion.block_size=2048"));
    /// assert!(plan.unused_options().is_empty());
    /// // CpuFusion configured otherwise: the header says what it runs with; the option is unused.
    /// let fusion = Arc::new(CpuFusion::new().block_size(16));
    /// let plan = Plan::compile_with_options(&trace, &[fusion.clone(), CpuReference::shared()], &options).unwrap();
    /// assert!(plan.to_string().contains("# developer options: cpu_fusion.block_size=16"));
    /// assert_eq!(plan.unused_options(), &["cpu_fusion.block_size".to_string()]);
    /// // And without options at all.
    /// let plan = Plan::compile(&trace, &[fusion, CpuReference::shared()]).unwrap();
    /// assert!(plan.to_string().contains("# developer options: cpu_fusion.block_size=16"));
    /// ```
    ///
    /// # Errors
    /// As for [`compile`](Self::compile); [`Error::InvalidOptionValue`] for a name in
    /// `runtime.nvtx_executors` that none of `executors` and no built-in executor has.
    pub fn compile_with_options(
        trace: &Trace<'_>,
        executors: &[Arc<dyn Executor>],
        options: &crate::options::Options,
    ) -> Result<Plan> {
        let filter = RangeFilter::from_options(options)?;
        filter.check_named_executors_exist(executors.iter().map(|e| e.name()))?;
        let mut plan = Self::compile_filtered(trace, executors, &filter)?;
        // The runtime's own developer options are in force as set; the executors' are listed
        // as they were configured (by `compile`).
        let runtime = options.developer_overrides().into_iter().filter(|o| o.starts_with("runtime."));
        plan.developer_options.splice(0..0, runtime);
        // An option has an effect when the runtime reads it, or an executor that declares it
        // (several may: `cuda.*` is both CUDA executors') and runs steps of the plan was
        // configured with the value set.
        plan.unused_options = options
            .set_names()
            .filter(|&name| {
                let owner = name.split('.').next().unwrap_or(name);
                let set = options.get(name).ok();
                let runs_steps = |i: usize| plan.steps.iter().any(|s| s.executor == i);
                let declares = |e: &Arc<dyn Executor>| e.options().iter().any(|s| s.name == name);
                let in_force =
                    executors.iter().enumerate().filter(|(i, e)| declares(e) && runs_steps(*i)).any(|(_, e)| {
                        let configured = e.configured_options();
                        configured.iter().find(|(n, _)| *n == name).is_none_or(|(_, value)| Some(value) == set.as_ref())
                    });
                owner != "runtime" && !in_force
            })
            .map(str::to_string)
            .collect();
        Ok(plan)
    }

    /// Options that were set but that neither the runtime nor any executor of this plan reads.
    pub fn unused_options(&self) -> &[String] {
        &self.unused_options
    }

    /// `name=value` of the developer options this plan was built with.
    pub fn developer_options(&self) -> &[String] {
        &self.developer_options
    }

    /// A number unique to this plan in the process (plans are numbered from 1 as they are
    /// compiled); NVTX payloads and timelines name plans by it.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Bytes of device memory one workspace of this plan holds for its values (allocated by its
    /// first run; a device library's own workspaces, such as cuBLASLt's, come on top): 0 for a
    /// plan without device steps. Values whose lifetimes do not overlap share memory (the
    /// outputs and the uploads of inputs keep their own): on a device that makes buffers within
    /// one allocation ([`Device::alloc_within`], as CUDA's does) they live in one block, about
    /// the most memory live at any step; on others they share whole buffers of their length. So
    /// a training step holds what its backward keeps alive, not every value it computes. This
    /// counts the uploads of
    /// every input; a workspace whose runs give inputs on the device holds less
    /// ([`Workspace::device_bytes`](super::Workspace::device_bytes)).
    ///
    /// ```
    /// use boundscope::{executors::CpuReference, Arena, Plan, Registry, TraceBuilder};
    /// let (registry, arena) = (Registry::with_builtins(), Arena::new());
    /// let mut b = TraceBuilder::new(&arena, &registry);
    /// let x = b.input(&[1024]).unwrap();
    /// let y = b.exp(x).unwrap();
    /// b.output(y).unwrap();
    /// let plan = Plan::compile(&b.finish().unwrap(), &[CpuReference::shared()]).unwrap();
    /// assert_eq!(plan.device_bytes(), 0);
    /// ```
    pub fn device_bytes(&self) -> usize {
        let own: usize = (self.device_lengths.iter().zip(&self.device_offsets))
            .filter(|(_, offset)| offset.is_none())
            .map(|(&len, _)| len)
            .sum();
        (own + self.device_block_words) * std::mem::size_of::<f32>()
    }

    /// Number of compiled steps (bound symbols after decomposing unclaimed composites).
    pub fn len(&self) -> usize {
        self.steps.len()
    }

    /// Whether the plan has no steps.
    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }

    /// The shapes of the inputs `run` expects, in order.
    pub fn input_shapes(&self) -> impl Iterator<Item = &[usize]> {
        self.input_shapes.iter().map(|s| s.as_slice())
    }

    /// The shapes of the outputs, in order.
    pub fn output_shapes(&self) -> impl Iterator<Item = &[usize]> {
        self.outputs.iter().map(|&b| self.buffers[b as usize].shape.as_slice())
    }

    /// Switches profiling guards on or off without recompiling (on by default). Off, a run
    /// costs what it costs without profiling guards: the run loop takes a schedule without
    /// them. Guards that are not profiling guards (see
    /// [`Guard::is_profiling`](crate::guards::Guard::is_profiling)) always run.
    ///
    /// ```
    /// use boundscope::guards::{Recorder, Selection};
    /// use boundscope::{executors::CpuReference, Arena, Plan, Registry, Tensor, TraceBuilder};
    /// let registry = Registry::with_builtins();
    /// let arena = Arena::new();
    /// let mut b = TraceBuilder::new(&arena, &registry);
    /// let x = b.input(&[4]).unwrap();
    /// let y = b.exp(x).unwrap();
    /// b.output(y).unwrap();
    /// let mut trace = b.finish().unwrap();
    /// let recorder = Recorder::new();
    /// trace.attach_guard(Selection::All, recorder.clone()).unwrap();
    /// let plan = Plan::compile(&trace, &[CpuReference::shared()]).unwrap();
    /// plan.set_profiling(false);
    /// plan.run(&[&Tensor::zeros(&[4])]).unwrap();
    /// assert!(recorder.is_empty());
    /// plan.set_profiling(true);
    /// plan.run(&[&Tensor::zeros(&[4])]).unwrap();
    /// assert_eq!(recorder.len(), 1);
    /// ```
    pub fn set_profiling(&self, on: bool) {
        self.profiling.store(on, Ordering::Relaxed);
    }

    /// Whether profiling guards are on.
    pub fn profiling(&self) -> bool {
        self.profiling.load(Ordering::Relaxed)
    }

    /// Guards that cannot run in this plan, with the reason (for example, a guard on the
    /// subsymbols of a composite that an executor runs whole), followed by those the trace's
    /// passes dropped.
    pub fn dropped_guards(&self) -> &[DroppedGuard] {
        &self.dropped_guards
    }

    /// Every NVTX range one run pushes with the current profiling setting
    /// ([`set_profiling`](Self::set_profiling)), in push order, with its scope, level, domain,
    /// label, category, colour, payload and who pushes it (the runtime, or the executor that
    /// declared it pushes its own region ranges). A profiler's record of one run equals this
    /// list. `format!("{plan:#}")` lists it under the steps.
    ///
    /// ```
    /// use boundscope::guards::{NvtxRange, Selection};
    /// use boundscope::passes::{FuseRegions, Pass, ProfileOps};
    /// use boundscope::executors::{CpuFusion, CpuReference};
    /// use boundscope::{Arena, Plan, PushedBy, Registry, TraceBuilder};
    /// let registry = Registry::with_builtins();
    /// let arena = Arena::new();
    /// let mut b = TraceBuilder::new(&arena, &registry);
    /// let x = b.input(&[64]).unwrap();
    /// let e = b.exp(x).unwrap();
    /// let y = b.neg(e).unwrap();
    /// b.output(y).unwrap();
    /// let trace = b.finish().unwrap();
    /// // Profiled twice (still one range per op), plus a range in a domain of our own.
    /// let profiled = ProfileOps::new().run(&ProfileOps::new().run(&trace, &arena).unwrap(), &arena).unwrap();
    /// let mut fused = FuseRegions::new(CpuFusion::shared()).run(&profiled, &arena).unwrap();
    /// fused.attach_guard(Selection::All, NvtxRange::new().domain("mine").unwrap()).unwrap();
    /// let plan = Plan::compile(&fused, &[CpuFusion::shared(), CpuReference::shared()]).unwrap();
    /// let map = plan.range_map();
    /// // CpuFusion pushes the region's range in `boundscope` itself; the runtime the one in `mine`.
    /// assert_eq!(map.len(), 2);
    /// assert_eq!(map.ranges()[0].domain, "mine");
    /// assert_eq!(map.ranges()[0].pushed_by, PushedBy::Runtime);
    /// assert_eq!(map.ranges()[1].domain, "boundscope");
    /// assert_eq!(map.ranges()[1].label, "CpuFusion0: (exp, neg)");
    /// assert_eq!(map.ranges()[1].pushed_by, PushedBy::Executor("cpu_fusion".into()));
    /// plan.set_profiling(false);
    /// assert!(plan.range_map().is_empty());
    /// ```
    pub fn range_map(&self) -> &RangeMap {
        &self.range_maps[if self.profiling() { 0 } else { 1 }]
    }

    /// What the plan reports about its guards: NVTX ranges of one domain merged on one scope
    /// whose settings conflicted (the first explicit one is kept), guards of other kinds in a
    /// domain merged away, what passes did to the trace's named scopes
    /// ([`Trace::scope_notes`]: scope ranges cut around a region that straddles them), and
    /// declarations in an executor's [`Executor::emits`] that the runtime does not use (a
    /// second NVTX domain at one level, other levels, other kinds). Also listed in the plan's
    /// header.
    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    /// Number of prepared guard scopes.
    pub fn guard_scope_count(&self) -> usize {
        self.scopes.len()
    }

    /// How many steps each executor runs, by executor name, in executor-list order.
    pub fn steps_per_executor(&self) -> Vec<(&str, usize)> {
        let mut counts = vec![0; self.executor_names.len() + 1];
        for step in &self.steps {
            counts[step.executor] += 1;
        }
        self.executor_names.iter().map(String::as_str).chain(["runtime"]).zip(counts).filter(|(_, n)| *n > 0).collect()
    }
}

impl fmt::Display for Plan {
    /// One line per step, with the executor that runs it; with `{:#}`, then the range map
    /// ([`Plan::range_map`]).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "# boundscope plan: {} step{}", self.steps.len(), if self.steps.len() == 1 { "" } else { "s" })?;
        if !self.developer_options.is_empty() {
            writeln!(f, "# developer options: {}", self.developer_options.join(", "))?;
        }
        if !self.unused_options.is_empty() {
            writeln!(f, "# options no executor of this plan reads: {}", self.unused_options.join(", "))?;
        }
        for note in &self.notes {
            writeln!(f, "# note: {note}")?;
        }
        if let Some(device) = &self.device {
            let block = self.device_block_words * std::mem::size_of::<f32>();
            writeln!(
                f,
                "# device memory on `{}`: {} bytes per workspace, {block} of them in one block shared by values \
                 that are never live together",
                device.name(),
                self.device_bytes()
            )?;
        }
        for (i, step) in self.steps.iter().enumerate() {
            let executor = self.executor_names.get(step.executor).map_or("runtime", String::as_str);
            write!(f, "  {:<40}  # step {i}, {executor}", step.line)?;
            for &(input, output) in &step.in_place {
                write!(f, ", writes output {output} over input {input} (in place)")?;
            }
            if let Some(note) = match &step.work {
                Work::Device(kernel) => kernel.launch_note(),
                _ => None,
            } {
                write!(f, ", {note}")?;
            }
            writeln!(f)?;
        }
        if f.alternate() {
            write!(f, "{}", self.range_map())?;
        }
        Ok(())
    }
}

impl fmt::Debug for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Plan").field("steps", &self.steps.len()).field("executors", &self.executor_names).finish()
    }
}

/// The step of a `reshape` on the device: nothing to do, its output shares its input's buffer.
struct DeviceView;

impl DeviceKernel for DeviceView {
    fn run(
        &self,
        _inputs: &[&dyn super::device::DeviceBuffer],
        _outputs: &mut [&mut dyn super::device::DeviceBuffer],
    ) -> Result<()> {
        Ok(())
    }
}

struct Compiler<'c, 't> {
    trace: &'c Trace<'t>,
    executors: &'c [Arc<dyn Executor>],
    /// Where each value is on the host (an input or a host buffer), if it is there.
    value_slots: Vec<Option<Slot>>,
    /// Which device buffer holds each value, if one does.
    device_slots: Vec<Option<u32>>,
    steps: Vec<Step>,
    buffers: Vec<TensorMeta>,
    device: Option<Arc<dyn Device>>,
    device_lengths: Vec<usize>,
    /// `(step, device buffer)` of each download that only brings an output to the host.
    output_downloads: Vec<(usize, u32)>,
    /// Which NVTX ranges the plan prepares (region ranges that executors push included).
    filter: &'c RangeFilter,
    /// What each scope surrounds, for structured payloads.
    details_of: DetailsOf<'c, 't>,
}

impl<'c, 't> Compiler<'c, 't> {
    /// The first executor that takes `op`'s dtypes and claims it.
    fn claimant(&self, op: &OpView<'_>) -> Option<usize> {
        let dtypes = op.dtypes();
        self.executors.iter().position(|e| dtypes.iter().all(|d| e.dtypes().contains(d)) && e.claims(op))
    }

    /// The error for `op`, which no executor claimed: a dtype none of them takes, when that is
    /// why, else no executor at all.
    fn unclaimed(&self, op: &OpView<'_>) -> Error {
        let dtypes = op.dtypes();
        let refused = dtypes.iter().find(|d| self.executors.iter().any(|e| !e.dtypes().contains(d) && e.claims(op)));
        match refused {
            Some(&dtype) => Error::UnsupportedDType {
                symbol: op.name().to_string(),
                dtype,
                tried: self
                    .executors
                    .iter()
                    .map(|e| {
                        let takes: Vec<&str> = e.dtypes().iter().map(|d| d.name()).collect();
                        format!("{} takes {}", e.name(), takes.join(", "))
                    })
                    .collect(),
            },
            None => Error::NoExecutor {
                symbol: op.name().to_string(),
                tried: self.executors.iter().map(|e| e.name().to_string()).collect(),
            },
        }
    }

    fn dtype(&self, value: ValueId) -> DType {
        self.trace.dtype_of(value)
    }

    fn shape(&self, value: ValueId) -> Result<&'t [usize]> {
        self.trace.meta(value).map(|m| m.shape).ok_or(Error::UndefinedValue { value, used_by: "Plan::compile".into() })
    }

    /// Compiles the top-level bound symbol at `position`; a region whose executor pushes its
    /// own NVTX region ranges gets the range it must push.
    fn compile_top_level(
        &mut self,
        position: usize,
        bsym: &'c BoundSymbol<'t>,
        profiling: &Arc<AtomicBool>,
    ) -> Result<CompiledNode> {
        let op = OpView::new(self.trace, bsym)?;
        // Asked once: the executor that claims it is the one its range is made for.
        let claimed = self.claimant(&op);
        let range = match claimed.map(|i| &self.executors[i]) {
            Some(executor) => {
                let level = if bsym.symbol() == prims::REGION { Level::Region } else { Level::Op };
                let emitted = emitted_domain(executor.emits(), level);
                if let Some(domain) = emitted.filter(|d| d.is_empty() || d.contains('\0')) {
                    return Err(Error::InvalidLabel {
                        label: domain.escape_default().to_string(),
                        detail: format!(
                            "executor `{}` declares this NVTX domain in `Executor::emits`; a domain name must be \
                             non-empty and without NUL",
                            executor.name()
                        ),
                    });
                }
                emitted.and_then(|domain| {
                    let details = self.details_of.of_span(position, 1, 0, 0);
                    let site = EmittingSite { position, level, executor: executor.name(), domain };
                    emitted_range(self.trace, &site, profiling, self.filter, details)
                })
            }
            None => None,
        };
        self.compile_claimed(bsym, claimed, range.as_ref())
    }

    /// Compiles one bound symbol; `region_range` is the range its executor pushes itself.
    fn compile_bound_symbol(
        &mut self,
        bsym: &'c BoundSymbol<'t>,
        region_range: Option<&RegionRange>,
    ) -> Result<CompiledNode> {
        let op = OpView::new(self.trace, bsym)?;
        let claimed = self.claimant(&op);
        self.compile_claimed(bsym, claimed, region_range)
    }

    /// Compiles one bound symbol for the executor at `claimed` (decomposing it when none
    /// claimed it); `region_range` is the range its executor pushes itself.
    fn compile_claimed(
        &mut self,
        bsym: &'c BoundSymbol<'t>,
        claimed: Option<usize>,
        region_range: Option<&RegionRange>,
    ) -> Result<CompiledNode> {
        let mut op = OpView::new(self.trace, bsym)?;
        let first = self.steps.len();
        let Some(executor) = claimed else {
            if bsym.subsymbols().is_empty() {
                return Err(self.unclaimed(&op));
            }
            let mut children = Vec::with_capacity(bsym.subsymbols().len());
            for sub in bsym.subsymbols() {
                children.push(self.compile_bound_symbol(sub, None)?);
            }
            // Steps of the decomposition that no inner composite named.
            let name: std::sync::Arc<str> = op.name().into();
            for step in self.steps[first..].iter_mut().filter(|s| s.within.is_none()) {
                step.within = Some(name.clone());
            }
            return Ok(CompiledNode { first, len: self.steps.len() - first, children, emitted: None });
        };
        let on_device = self.executors[executor].device().is_some();
        // Transfers first, so that the kernel's step is known when its region range is made.
        let mut inputs = SmallVec::new();
        for v in bsym.inputs() {
            inputs.push(if on_device { self.on_device(v, op.name())? } else { self.on_host(v, op.name())? });
        }
        // A `reshape` on the device is a view: its value is its input's buffer, read in the
        // same order (device buffers are dense), and its step does nothing. Not for an output,
        // which keeps a buffer of its own.
        if let (true, Some(&Slot::Device(buffer)), &[out]) = (on_device, inputs.first(), bsym.outputs()) {
            if bsym.symbol() == prims::RESHAPE && !self.trace.outputs().contains(&out) {
                self.device_slots[out.index()] = Some(buffer);
                let line = format!("{}  (a view: no copy)", format_line(self.trace, bsym));
                self.steps.push(Step::new(Work::Device(Box::new(DeviceView)), inputs, SmallVec::new(), line, executor));
                return Ok(CompiledNode { first, len: self.steps.len() - first, children: Vec::new(), emitted: None });
            }
        }
        let region_range = region_range.map(|r| r.at_step(self.steps.len()));
        op.region_range = region_range.as_ref();
        let work = if on_device {
            Work::Device(self.executors[executor].compile_device(&op)?)
        } else {
            Work::Host(self.executors[executor].compile(&op)?)
        };
        let mut outputs = SmallVec::new();
        // An output the executor says is a view of an input shares that input's buffer; its
        // kernel gets no output buffer.
        let view_of = match (on_device, bsym.outputs()) {
            (true, &[out]) if !self.trace.outputs().contains(&out) => {
                match self.executors[executor].output_views(&op).and_then(|i| inputs.get(i)) {
                    Some(&Slot::Device(buffer)) => Some((out, buffer)),
                    _ => None,
                }
            }
            _ => None,
        };
        if let Some((out, buffer)) = view_of {
            self.device_slots[out.index()] = Some(buffer);
        }
        for &o in bsym.outputs().iter().filter(|_| view_of.is_none()) {
            let shape = self.shape(o)?;
            if on_device {
                let buffer = self.new_device_buffer(shape, self.dtype(o));
                self.device_slots[o.index()] = Some(buffer);
                outputs.push(buffer);
            } else {
                let buffer = self.new_buffer(shape, self.dtype(o));
                self.value_slots[o.index()] = Some(Slot::Buffer(buffer));
                outputs.push(buffer);
            }
        }
        let line = format_line(self.trace, bsym);
        // A composite run whole names itself, so that a composite whose decomposition holds it
        // does not rename it ([`Step::within`]).
        let within = (op.symbol().category() == crate::core::ir::Category::Composite).then(|| op.name().into());
        let emitted = region_range.map(|range| EmittedRegionRange {
            step: self.steps.len(),
            executor: self.executors[executor].name().to_string(),
            range: range.clone(),
        });
        let mut step = Step::new(work, inputs, outputs, line, executor);
        step.within = within;
        self.steps.push(step);
        // The op's scope covers the transfers it needed (inserted just before it) and the op.
        Ok(CompiledNode { first, len: self.steps.len() - first, children: Vec::new(), emitted })
    }

    /// The host slot of a value, downloading it first if it is only on the device.
    fn on_host(&mut self, value: ValueId, used_by: &str) -> Result<Slot> {
        if let Some(slot) = self.value_slots[value.index()] {
            return Ok(slot);
        }
        let device =
            self.device_slots[value.index()].ok_or(Error::UndefinedValue { value, used_by: used_by.into() })?;
        let buffer = self.new_buffer(self.shape(value)?, self.dtype(value));
        self.steps.push(Step::new(
            Work::Download,
            SmallVec::from_slice(&[Slot::Device(device)]),
            SmallVec::from_slice(&[buffer]),
            format!("download {value} from the device"),
            self.executors.len(),
        ));
        self.value_slots[value.index()] = Some(Slot::Buffer(buffer));
        Ok(Slot::Buffer(buffer))
    }

    /// The device slot of a value, uploading it first if it is only on the host.
    fn on_device(&mut self, value: ValueId, used_by: &str) -> Result<Slot> {
        if let Some(buffer) = self.device_slots[value.index()] {
            return Ok(Slot::Device(buffer));
        }
        let host = self.value_slots[value.index()].ok_or(Error::UndefinedValue { value, used_by: used_by.into() })?;
        let buffer = self.new_device_buffer(self.shape(value)?, self.dtype(value));
        self.steps.push(Step::new(
            Work::Upload,
            SmallVec::from_slice(&[host]),
            SmallVec::from_slice(&[buffer]),
            format!("upload {value} to the device"),
            self.executors.len(),
        ));
        self.device_slots[value.index()] = Some(buffer);
        Ok(Slot::Device(buffer))
    }

    /// A device buffer for a value of `shape` and `dtype`: its length in words (16-bit values
    /// two per word, see `packing`).
    fn new_device_buffer(&mut self, shape: &[usize], dtype: DType) -> u32 {
        self.device_lengths.push(super::packing::words(dtype, shape.iter().product()));
        (self.device_lengths.len() - 1) as u32
    }

    fn new_buffer(&mut self, shape: &[usize], dtype: DType) -> u32 {
        self.buffers.push(TensorMeta::new(dtype, shape));
        (self.buffers.len() - 1) as u32
    }

    /// The buffer holding an output; an output that is a trace input gets a copy step, so that
    /// every output lives in the workspace.
    fn output_buffer(&mut self, value: ValueId) -> Result<u32> {
        let device = self.device_slots[value.index()];
        if let (None, Some(device)) = (self.value_slots[value.index()], device) {
            // A download that only brings an output to the host: `run_on_device` skips it.
            self.output_downloads.push((self.steps.len(), device));
            self.on_host(value, "trace output")?;
        }
        match self.value_slots[value.index()] {
            Some(Slot::Buffer(b)) => Ok(b),
            Some(input @ Slot::Input(_)) => {
                let buffer = self.new_buffer(self.shape(value)?, self.dtype(value));
                let copy = kernel_fn(|inputs, outputs| {
                    crate::core::tensor::with_same_values!(inputs[0].data, outputs[0].data.reborrow(), (x, out) => {
                        out.copy_from_slice(x);
                        Ok(())
                    }, _ => Err(Error::CopyMismatch {
                        expected: crate::TensorMeta::new(outputs[0].dtype(), outputs[0].shape),
                        got: crate::TensorMeta::new(inputs[0].dtype(), inputs[0].shape),
                    }))
                });
                self.steps.push(Step::new(
                    Work::Host(copy),
                    SmallVec::from_slice(&[input]),
                    SmallVec::from_slice(&[buffer]),
                    format!("copy of input {value} to the outputs"),
                    self.executors.len(),
                ));
                self.value_slots[value.index()] = Some(Slot::Buffer(buffer));
                Ok(buffer)
            }
            _ => Err(Error::UndefinedValue { value, used_by: "trace output".into() }),
        }
    }
}

/// `name=value` of every developer option that an executor running steps of the plan was
/// configured with, where the value is not the option's default (each executor once).
fn configured_developer_options(executors: &[Arc<dyn Executor>], steps: &[Step]) -> Vec<String> {
    let mut listed: Vec<String> = Vec::new();
    for (i, executor) in executors.iter().enumerate() {
        if !steps.iter().any(|s| s.executor == i) {
            continue;
        }
        for (name, value) in executor.configured_options() {
            let spec = executor.options().iter().find(|s| s.name == name);
            let setting = format!("{name}={value}");
            if spec.is_some_and(|s| s.audience == Audience::Developer && s.default != value)
                && !listed.contains(&setting)
            {
                listed.push(setting);
            }
        }
    }
    listed
}

/// Ops a region's label names; past them it counts the rest (a joined optimizer step holds
/// thousands of ops).
const LABELLED_OPS: usize = 16;

/// The default label of a region's ranges: `<Executor>Fusion<N>: (op, op, ...)`, its first
/// [`LABELLED_OPS`] ops, then `and <k> more` if it has more.
pub(crate) fn region_label(trace: &Trace<'_>, position: usize) -> String {
    let bsym = &trace.bound_symbols()[position];
    let subsymbols = bsym.subsymbols();
    let ops: Vec<&str> = subsymbols.iter().take(LABELLED_OPS).map(|s| trace.symbol_name(s)).collect();
    match subsymbols.len().saturating_sub(LABELLED_OPS) {
        0 => format!("{}: ({})", trace.symbol_name(bsym), ops.join(", ")),
        rest => format!("{}: ({}, and {rest} more)", trace.symbol_name(bsym), ops.join(", ")),
    }
}

/// A top-level bound symbol whose executor pushes its own range around it, at `level`
/// (a region's or an op's), into `domain`.
struct EmittingSite<'a> {
    position: usize,
    level: Level,
    executor: &'a str,
    domain: &'a str,
}

/// The range an executor that pushes its own region (or op) ranges into `domain` must push
/// around the region (or op) at `position`: `None` when it carries no NVTX guard in any
/// domain. Labelled, coloured and categorised by that domain's guards where they say so.
fn emitted_range(
    trace: &Trace<'_>,
    site: &EmittingSite<'_>,
    profiling: &Arc<AtomicBool>,
    filter: &RangeFilter,
    details: ScopeDetails,
) -> Option<RegionRange> {
    let EmittingSite { position, level, executor, domain } = *site;
    let bsym = &trace.bound_symbols()[position];
    // The same categories as its scope (`prepare_scopes`): a region's are `Fusion` and its
    // ops', an op's its own.
    let table = &trace.guards;
    // A region's attachments, or an op's at the op level (a subsymbol guard of a composite
    // that became this one op is a scope of its own, which the runtime pushes).
    let own = || {
        let at = table.at(position).iter();
        at.filter(move |a| a.depth == 0 && a.span == 1 && (level == Level::Region || a.level == Level::Op))
    };
    let beside = |a: &&Attachment| a.depth == 0 && a.span == 1 && level == Level::Op && a.level != Level::Op;
    if table.at(position).iter().filter(beside).any(|a| table.guard(a.guard).nvtx_domain() == Some(domain)) {
        // Another scope over exactly this op has a range in the executor's domain: the runtime
        // pushes both (and keeps one where they are twins), the executor none.
        return None;
    }
    let category_of = |id| trace.registry().get(id).map(|s| s.symbol.category()).ok();
    let categories: Vec<crate::Category> = if level == Level::Region {
        std::iter::once(crate::Category::Fusion)
            .chain(bsym.subsymbols().iter().filter_map(|s| category_of(s.symbol())))
            .collect()
    } else {
        own().filter_map(|a| category_of(a.origin)).collect()
    };
    if !filter.admits(level, executor, &categories) {
        return None;
    }
    let mut merged = ScopeGuards::default();
    for a in own() {
        merged.add(table, *a, |_| {});
    }
    if !merged.has_nvtx() {
        return None;
    }
    let settings = merged.nvtx_settings(table, domain).unwrap_or_default();
    // The label the runtime's scope would have: an op's is named by the symbol its first guard
    // was attached to (a composite that became this one op, say).
    let (label, ops) = if level == Level::Region {
        (region_label(trace, position), bsym.subsymbols().len() as u32)
    } else {
        let origin = own().next().map_or(bsym.symbol(), |a| a.origin);
        (trace.registry().get(origin).map(|s| s.symbol.name().to_string()).unwrap_or_default(), 1)
    };
    let site = GuardSite::new(&label, level, executor, ops).with_details(&details);
    let resolved = settings.resolve(&site);
    if enclosing_label(trace, position, domain, filter).as_deref() == Some(resolved.label) {
        // Its range would sit directly inside one of its domain with its label: that one is it.
        return None;
    }
    let parts = RegionRangeParts {
        label: resolved.label.to_string(),
        domain: domain.to_string(),
        level,
        ops,
        category: resolved.category,
        color: resolved.color,
        payload: resolved.payload,
        details: resolved.details.cloned(),
    };
    Some(RegionRange::new(parts, profiling.clone()))
}

/// The label of the innermost range of `domain` around the top-level bound symbol at
/// `position` (a span that covers it, a named scope that holds it, else the run's), if there
/// is one. Of a span and a scope over the same bound symbols, the span is inside.
fn enclosing_label(trace: &Trace<'_>, position: usize, domain: &str, filter: &RangeFilter) -> Option<String> {
    let table = &trace.guards;
    // Ranges of a level the filter leaves out are not there to enclose anything.
    let in_domain = |a: &Attachment| table.guard(a.guard).nvtx_domain() == Some(domain) && filter.admits_level(a.level);
    let innermost = (0..=position)
        .flat_map(|p| table.at(p).iter().map(move |a| (p, a)))
        .filter(|&(p, a)| {
            a.depth == 0 && p + a.span as usize > position && (p, a.span) != (position, 1) && in_domain(a)
        })
        .min_by_key(|&(p, a)| (a.span, std::cmp::Reverse(p)));
    let scope = trace
        .scopes()
        .iter()
        .filter(|s| s.positions().contains(&position) && filter.admits_level(Level::Scope))
        .filter(|s| s.guard_ids().iter().any(|&g| table.guard(g).nvtx_domain() == Some(domain)))
        .min_by_key(|s| (s.positions().len(), std::cmp::Reverse(s.depth())));
    let mut merged = ScopeGuards::default();
    let default = match (innermost, scope) {
        (Some((p, a)), scope) if scope.is_none_or(|s| a.span as usize <= s.positions().len()) => {
            for b in table.at(p).iter().filter(|b| b.depth == 0 && b.span == a.span) {
                merged.add(table, *b, |_| {});
            }
            trace.registry().get(a.origin).map(|s| s.symbol.name().to_string()).unwrap_or_default()
        }
        (_, Some(scope)) => {
            for on_scope in scope.attachments() {
                merged.add(table, on_scope, |_| {});
            }
            scope.path().to_string()
        }
        (_, None) if !filter.admits_level(Level::Trace) => return None,
        (_, None) => {
            for &g in &table.trace_level {
                let run = Attachment { guard: g, span: 1, depth: 0, level: Level::Trace, origin: prims::REGION };
                merged.add(table, run, |_| {});
            }
            "trace".to_string()
        }
    };
    let settings = merged.nvtx_settings(table, domain)?;
    Some(settings.label_or(&default).to_string())
}

fn format_line(trace: &Trace<'_>, bsym: &BoundSymbol<'_>) -> String {
    use std::fmt::Write;
    let mut line = String::new();
    for (i, o) in bsym.outputs().iter().enumerate() {
        let _ = write!(line, "{}{o}", if i == 0 { "" } else { ", " });
    }
    let _ = write!(line, " = {}(", trace.symbol_name(bsym));
    for (i, a) in bsym.args().iter().enumerate() {
        let _ = write!(line, "{}{a}", if i == 0 { "" } else { ", " });
    }
    line.push(')');
    if let Some(m) = bsym.outputs().first().and_then(|&o| trace.meta(o)) {
        let _ = write!(line, "  # {}{}", m.dtype, DimsDisplay(m.shape));
    }
    line
}

/// Each executor of a plan's list named, and by a name no other executor of the list takes
/// (the same executor given twice is the same executor): steps, notes, range filters and errors
/// name executors by [`Executor::name`].
fn check_executor_names(executors: &[Arc<dyn Executor>]) -> Result<()> {
    for (i, executor) in executors.iter().enumerate() {
        let name = executor.name();
        if name.is_empty() {
            return Err(Error::ExecutorName {
                name: String::new(),
                detail: format!(
                    "executor {i} of the list has an empty name; give `Executor::name` a short, unique one"
                ),
            });
        }
        if !crate::core::options::is_list_item(name) {
            return Err(Error::ExecutorName {
                name: name.escape_default().to_string(),
                detail: format!(
                    "executor {i} of the list is named `{}`: a name holds no `,` (lists of names, as \
                     `runtime.nvtx_executors`, are split there), control characters (it is printed in plan \
                     listings) or surrounding spaces",
                    name.escape_default()
                ),
            });
        }
        let same = |other: &Arc<dyn Executor>| std::ptr::addr_eq(Arc::as_ptr(other), Arc::as_ptr(executor));
        if let Some(j) = executors[..i].iter().position(|other| other.name() == name && !same(other)) {
            return Err(Error::ExecutorName {
                name: name.to_string(),
                detail: format!(
                    "executors {j} and {i} of the list are both named `{name}`, and the plan would credit one's steps \
                     to the other; rename one (`Executor::name` must be unique)"
                ),
            });
        }
    }
    Ok(())
}
