//! Users' own kernels on a [`CudaDevice`]: a [`CudaKernel`] gets each run as a [`CudaRun`] (the
//! run's stream, the device's context, typed device memory of each input and output, state it
//! keeps per workspace), and [`device_kernel`] makes it the [`DeviceKernel`] that
//! [`Executor::compile_device`](crate::Executor::compile_device) returns.

use std::any::Any;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::driver::{
    sys, CudaContext, CudaFunction, CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, DeviceRepr, LaunchConfig,
};
use smallvec::SmallVec;

use super::device::{cuda_error, slice, slice_mut, CudaDevice, RunPlace};
use super::device_checks::BufferLengths;
use crate::core::ir::DType;
use crate::core::plan::{packing, Device, DeviceBuffer, DeviceKernel, OpView, PreparedRegionRange};
use crate::error::{Error, Result};

/// An element type of device memory: the Rust type of a [`DType`]'s values (`f32`,
/// [`half::bf16`], [`half::f16`], `i64`, `i32`), as [`CudaRun::input`] and
/// [`CudaRun::output`] hand them out.
pub trait DeviceElement: DeviceRepr + sealed::Sealed + 'static {
    /// The dtype whose values it is.
    const DTYPE: DType;
}

mod sealed {
    pub trait Sealed {}
}

macro_rules! device_elements {
    ($($t:ty => $d:ident),*) => {$(
        impl sealed::Sealed for $t {}
        impl DeviceElement for $t {
            const DTYPE: DType = DType::$d;
        }
    )*};
}
device_elements!(f32 => F32, half::bf16 => BF16, half::f16 => F16, i64 => I64, i32 => I32);

/// A user's kernel for one bound symbol, on a [`CudaDevice`]: wrap it with [`device_kernel`]
/// in [`Executor::compile_device`](crate::Executor::compile_device).
///
/// # The contract
///
/// - **What it may touch.** Its inputs (read only) and outputs (written whole: an output holds
///   whatever an earlier run left there, never zeros you can count on), through
///   [`CudaRun`], and memory of its own (in its [`State`](Self::State), say). Nothing else of
///   the plan's: the workspace hands the same device memory to other steps before and after
///   this one, in stream order.
/// - **On which stream.** Every launch, copy or library call goes to [`CudaRun::stream`], the
///   run's stream (its workspace's queue): work there is ordered after the steps before it
///   and before the steps after it, is recorded by [`Plan::capture`](crate::Plan::capture)
///   into the plan's graph (the graph replays it with the rest), and is timed by
///   [`CudaEventTimer`](super::CudaEventTimer) guards on the op. Work queued on another stream
///   races with the plan, and is not captured: if you must use one, make it wait for an event
///   recorded on the run's stream, and the run's stream wait for it before you return, or
///   later in the run with [`CudaRun::keep_joined`] (which also joins it on a run's error). The
///   views' own `stream()` is the device's stream, not the run's (cudarc's per-buffer events
///   are off on this device: the plan orders its work itself), so pass `run.stream()` to every
///   call that takes one.
/// - **When buffers may be reused.** A buffer is the op's only for the work queued during the
///   call: keep no pointer or view past it (a graph replays the pointers it captured, which
///   stay valid as long as the graph's workspace).
/// - **Per-workspace state.** [`new_state`](Self::new_state) runs at the first run of the
///   kernel in each workspace (so, for a graph, in the uncaptured run that
///   [`Plan::capture`](crate::Plan::capture) makes first): allocate handles and buffers there,
///   not in [`run`](Self::run), which should allocate nothing (so that steady-state runs
///   allocate nothing on the host; so does the call itself, for ops of up to 16 inputs and 8
///   outputs). The state is dropped with its workspace (a workspace kept after its plan keeps
///   its kernels' states until it is dropped); a kernel called outside any plan run keeps one
///   state of its own. It is out of the workspace while `run` runs, so `run` may call other
///   kernels; a `run` that panics loses it, and the next run makes a new one. A state may be
///   dropped on another thread than its workspace's (the one that next orders the device's
///   stream after the workspace's last run): its drop must not take locks your runs hold.
/// - **No plan runs inside a kernel called outside any run.** Called directly (not by a plan),
///   a kernel holds the device's own stream for the call; a plan run from inside it is not
///   ordered with what the kernel queues after it. Run plans before or after the call.
/// - **Errors.** An error returned by `run` (or `new_state`) is the error of the plan's run
///   that queued it, unchanged; return typed errors ([`Error::Execution`] names the executor
///   and the op). A fault on the device while the kernel runs is CUDA's sticky error: the
///   next call on the context reports it (the plan's next download or synchronize), as for
///   the built-in kernels.
/// - **What is `unsafe`, and why.** Launching a kernel (cudarc's `launch_builder(..).launch`,
///   or [`CudaRun::launch`]) is `unsafe`: nothing checks that its parameters are the kernel's,
///   or that it reads and writes only within the buffers it is given. The plan checks, before
///   each call, that there are as many buffers as the op has tensors and that each holds at
///   least its tensor's elements ([`CudaRun::input_shape`] and friends say how many); the
///   rest is yours.
/// - **Ranges.** If the executor declares [`EmittedRange::nvtx_ops`](crate::EmittedRange::nvtx_ops)
///   (or `nvtx_regions`, for regions it claims), the kernel `device_kernel` makes pushes the
///   range [`OpView::region_range`] gives around each call to `run` (and, at a workspace's first
///   run, `new_state`), so the one-range-per-scope rule holds with no code of yours; it spans
///   the kernel's step, while the op's ranges in other domains also span the uploads the plan
///   makes for it. Push ranges in other domains yourself, if you like.
///
/// ```no_run
/// # // Needs a GPU: `examples/cuda_user_executor.rs` runs a complete one on the H200.
/// use std::sync::Arc;
/// use boundscope::executors::cuda::{device_kernel, CudaDevice, CudaKernel, CudaRun};
/// use boundscope::{Device, DeviceKernel, Executor, OpView, Result};
///
/// /// Copies its input to its output on the run's stream (a stand-in for a launch of yours).
/// struct Copy;
/// impl CudaKernel for Copy {
///     type State = ();
///     fn new_state(&self, _run: &CudaRun<'_>) -> Result<()> {
///         Ok(())
///     }
///     fn run(&self, run: &mut CudaRun<'_>, _state: &mut ()) -> Result<()> {
///         let x = run.input::<f32>(0)?;
///         let stream = run.stream().clone();
///         let mut y = run.output::<f32>(0)?;
///         stream.memcpy_dtod(&x, &mut y).map_err(|e| run.error(e))
///     }
/// }
///
/// struct MyExecutor(Arc<CudaDevice>);
/// impl Executor for MyExecutor {
///     fn name(&self) -> &str { "my_executor" }
///     fn claims(&self, op: &OpView<'_>) -> bool { op.name() == "my_copy" }
///     fn device(&self) -> Option<Arc<dyn Device>> { Some(self.0.clone()) }
///     fn compile_device(&self, op: &OpView<'_>) -> Result<Box<dyn DeviceKernel>> {
///         device_kernel(&self.0, self.name(), op, Copy)
///     }
/// }
/// ```
pub trait CudaKernel: Send + Sync + 'static {
    /// What it keeps per workspace (a cuBLAS handle, a scratch buffer; `()` for nothing).
    type State: Send + 'static;

    /// Makes the state of one workspace, at the kernel's first run in it.
    ///
    /// # Errors
    /// Whatever stops it (a failed allocation): the run's error.
    fn new_state(&self, run: &CudaRun<'_>) -> Result<Self::State>;

    /// Queues the op's work on [`run.stream()`](CudaRun::stream).
    ///
    /// # Errors
    /// Whatever stops it: the run's error, unchanged.
    fn run(&self, run: &mut CudaRun<'_>, state: &mut Self::State) -> Result<()>;

    /// What the plan's listing says of how the kernel runs, on its step's line after the
    /// executor ([`DeviceKernel::launch_note`]): one line, no newline, such as
    /// `"grid 128 x 256, 48 KB shared"`. Default: nothing.
    fn launch_note(&self) -> Option<String> {
        None
    }
}

/// The dtype and shape of each of an op's tensors, from the trace it was compiled from.
struct Tensors {
    inputs: Vec<(DType, Vec<usize>)>,
    outputs: Vec<(DType, Vec<usize>)>,
}

/// One run of a user's kernel: the run's stream, the device, and the op's device memory,
/// typed. Given to [`CudaKernel::run`] and [`CudaKernel::new_state`].
pub struct CudaRun<'r> {
    device: &'r Arc<CudaDevice>,
    stream: &'r Arc<CudaStream>,
    inputs: SmallVec<[&'r CudaSlice<f32>; 16]>,
    outputs: SmallVec<[&'r mut CudaSlice<f32>; 8]>,
    tensors: &'r Tensors,
    executor: &'r str,
    symbol: &'r str,
}

/// A tensor's device memory as a raw pointer, its length in elements and its dtype: for
/// launches that take pointers (a PTX of yours with raw parameters, a C library).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceMemory {
    /// The device address of its first element.
    pub ptr: sys::CUdeviceptr,
    /// Its elements (of `dtype`).
    pub len: usize,
    /// The dtype of its elements.
    pub dtype: DType,
}

impl<'r> CudaRun<'r> {
    /// The stream of this run (its workspace's queue): queue everything here. For a workspace
    /// made by [`Plan::workspace_on_device_queue`](crate::Plan::workspace_on_device_queue) it is
    /// the device's own stream, which other threads' uploads and downloads use too: do not
    /// synchronize it or capture on it.
    pub fn stream(&self) -> &'r Arc<CudaStream> {
        self.stream
    }

    /// The device's CUDA context.
    pub fn context(&self) -> &'r Arc<CudaContext> {
        self.device.context()
    }

    /// The device.
    pub fn device(&self) -> &'r Arc<CudaDevice> {
        self.device
    }

    /// The device's ordinal (0 for the first GPU).
    pub fn ordinal(&self) -> usize {
        self.device.ordinal()
    }

    /// The number of tensor inputs.
    pub fn input_count(&self) -> usize {
        self.tensors.inputs.len()
    }

    /// The number of outputs.
    pub fn output_count(&self) -> usize {
        self.tensors.outputs.len()
    }

    /// The dtype of input `i`.
    ///
    /// # Errors
    /// [`Error::Execution`] past the last input.
    pub fn input_dtype(&self, i: usize) -> Result<DType> {
        self.input_tensor(i).map(|t| t.0)
    }

    /// The shape of input `i`.
    ///
    /// # Errors
    /// [`Error::Execution`] past the last input.
    pub fn input_shape(&self, i: usize) -> Result<&'r [usize]> {
        self.input_tensor(i).map(|t| t.1.as_slice())
    }

    /// The dtype of output `i`.
    ///
    /// # Errors
    /// [`Error::Execution`] past the last output.
    pub fn output_dtype(&self, i: usize) -> Result<DType> {
        self.output_tensor(i).map(|t| t.0)
    }

    /// The shape of output `i`.
    ///
    /// # Errors
    /// [`Error::Execution`] past the last output.
    pub fn output_shape(&self, i: usize) -> Result<&'r [usize]> {
        self.output_tensor(i).map(|t| t.1.as_slice())
    }

    /// Input `i` as device memory of its dtype's values (`T` = `f32`, [`half::bf16`],
    /// [`half::f16`], `i64` or `i32`), as many as its shape holds. 16-bit values are the
    /// array of their dtype, two to a 4-byte word as in any `__nv_bfloat16*` or `__half*`.
    ///
    /// # Errors
    /// [`Error::DTypeMismatch`] when the input is of another dtype (naming it);
    /// [`Error::Execution`] past the last input.
    pub fn input<T: DeviceElement>(&self, i: usize) -> Result<CudaView<'r, T>> {
        let (dtype, len) = self.typed(self.input_tensor(i)?, T::DTYPE, "input", i)?;
        let buffer: &'r CudaSlice<f32> = self.inputs[i];
        // SAFETY: the buffer holds the values of its dtype in their own bits, in the layout of
        // an array of that dtype (`core::plan::packing`), which is `T`'s (every bit pattern is
        // a value of these types); `BufferLengths::check` made sure it holds `len` of them.
        unsafe { buffer.transmute::<T>(len) }.ok_or_else(|| self.short(dtype, len, "input", i))
    }

    /// Output `i` as device memory of its dtype's values, to write whole (see
    /// [`input`](Self::input)). One output at a time; [`output_memory`](Self::output_memory)
    /// gives the pointers of several at once.
    ///
    /// # Errors
    /// [`Error::DTypeMismatch`] when the output is of another dtype; [`Error::Execution`] past
    /// the last output.
    pub fn output<T: DeviceElement>(&mut self, i: usize) -> Result<CudaViewMut<'_, T>> {
        let (dtype, len) = self.typed(self.output_tensor(i)?, T::DTYPE, "output", i)?;
        if len.saturating_mul(size_of::<T>()) > self.outputs[i].len() * size_of::<f32>() {
            return Err(self.short(dtype, len, "output", i));
        }
        // SAFETY: as for `input`.
        let view = unsafe { self.outputs[i].transmute_mut::<T>(len) };
        view.ok_or_else(|| cuda_error("output", "shorter than its shape"))
    }

    /// Every output as device memory of its dtype's values, at once (for a call that writes
    /// several), when they are all of `T`'s dtype.
    ///
    /// # Errors
    /// [`Error::DTypeMismatch`] naming the first output of another dtype.
    pub fn outputs<T: DeviceElement>(&mut self) -> Result<SmallVec<[CudaViewMut<'_, T>; 8]>> {
        let mut lengths: SmallVec<[usize; 8]> = SmallVec::new();
        for (i, tensor) in self.tensors.outputs.iter().enumerate() {
            let (dtype, len) = self.typed(tensor, T::DTYPE, "output", i)?;
            if len.saturating_mul(size_of::<T>()) > self.outputs[i].len() * size_of::<f32>() {
                return Err(self.short(dtype, len, "output", i));
            }
            lengths.push(len);
        }
        // SAFETY: as for `input`; the outputs are distinct buffers, so the views do not overlap.
        let views = self.outputs.iter_mut().zip(lengths).map(|(o, len)| unsafe { o.transmute_mut::<T>(len) });
        views.map(|v| v.ok_or_else(|| cuda_error("output", "shorter than its shape"))).collect()
    }

    /// Input `i` as a raw device pointer, its length in elements and its dtype.
    ///
    /// # Errors
    /// [`Error::Execution`] past the last input.
    pub fn input_memory(&self, i: usize) -> Result<DeviceMemory> {
        let (dtype, shape) = self.input_tensor(i)?;
        Ok(DeviceMemory { ptr: self.inputs[i].device_ptr(self.stream).0, len: shape.iter().product(), dtype: *dtype })
    }

    /// Output `i` as a raw device pointer, its length in elements and its dtype (to write
    /// whole).
    ///
    /// # Errors
    /// [`Error::Execution`] past the last output.
    pub fn output_memory(&self, i: usize) -> Result<DeviceMemory> {
        let (dtype, shape) = self.output_tensor(i)?;
        Ok(DeviceMemory { ptr: self.outputs[i].device_ptr(self.stream).0, len: shape.iter().product(), dtype: *dtype })
    }

    /// Launches `function` on the run's stream, with no allocation (cudarc's launch builder
    /// collects its arguments in a `Vec`, one allocation per launch).
    ///
    /// # Safety
    /// `params` must point at exactly the kernel's parameters, in order, each alive for the
    /// call, and the kernel must read and write only within the memory they name.
    ///
    /// # Errors
    /// CUDA's launch error, as [`Error::Execution`].
    pub unsafe fn launch(
        &self,
        function: &CudaFunction,
        config: LaunchConfig,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        let LaunchConfig { grid_dim, block_dim, shared_mem_bytes } = config;
        let stream = self.stream.cu_stream();
        // SAFETY: the caller's contract.
        unsafe {
            cudarc::driver::result::launch_kernel(
                function.cu_function(),
                grid_dim,
                block_dim,
                shared_mem_bytes,
                stream,
                params,
            )
        }
        .map_err(|e| self.error(e))
    }

    /// Says that work queued on `side`, a stream of the kernel's own, uses the op's buffers
    /// after `run` returns, until a later kernel of the run makes the run's stream wait for it
    /// (and says so with [`joined`](Self::joined)): a collective started on a stream of its own
    /// and waited for later, say. Whatever ends the run (its last step, an error, a panic),
    /// the run's stream then waits for `side` before the run leaves its workspace, so no later
    /// run reuses those buffers while `side` may still use them. Outside a run, the device's
    /// stream waits for `side` now.
    ///
    /// # Errors
    /// CUDA's error making a stream wait, as [`Error::Execution`].
    pub fn keep_joined(&self, side: &Arc<CudaStream>) -> Result<()> {
        match self.device.current_queue() {
            Some(queue) => {
                queue.joins.add(side);
                Ok(())
            }
            None => self.stream.join(side).map_err(|e| self.error(e)),
        }
    }

    /// Says that the run's stream now waits for `side`'s work (the kernel queued the wait
    /// itself), so the run need not wait for it at its end ([`keep_joined`](Self::keep_joined)).
    pub fn joined(&self, side: &Arc<CudaStream>) {
        self.device.joined(side);
    }

    /// An [`Error::Execution`] naming the executor and the op, with `what` as its message:
    /// for the errors of the CUDA calls a kernel makes (`.map_err(|e| run.error(e))`).
    pub fn error(&self, what: impl std::fmt::Debug) -> Error {
        Error::Execution { executor: self.executor.into(), symbol: self.symbol.into(), message: format!("{what:?}") }
    }

    fn input_tensor(&self, i: usize) -> Result<&'r (DType, Vec<usize>)> {
        let tensors: &'r Tensors = self.tensors;
        tensors.inputs.get(i).ok_or_else(|| self.missing("input", i, tensors.inputs.len()))
    }

    fn output_tensor(&self, i: usize) -> Result<&'r (DType, Vec<usize>)> {
        let tensors: &'r Tensors = self.tensors;
        tensors.outputs.get(i).ok_or_else(|| self.missing("output", i, tensors.outputs.len()))
    }

    fn missing(&self, what: &str, i: usize, count: usize) -> Error {
        Error::Execution {
            executor: self.executor.into(),
            symbol: self.symbol.into(),
            message: format!("it has {count} {what}s (numbered from 0), not {what} {i}"),
        }
    }

    /// The dtype and element count of a tensor read as `asked`, if it is of that dtype.
    fn typed(&self, tensor: &(DType, Vec<usize>), asked: DType, what: &str, i: usize) -> Result<(DType, usize)> {
        let (dtype, shape) = tensor;
        if *dtype != asked {
            return Err(Error::DTypeMismatch {
                what: format!("{what} {i} of `{}` (on {})", self.symbol, self.executor),
                expected: asked,
                got: *dtype,
            });
        }
        Ok((*dtype, shape.iter().product()))
    }

    fn short(&self, dtype: DType, len: usize, what: &str, i: usize) -> Error {
        self.error(format!("{what} {i} holds fewer than its {len} {dtype} values"))
    }
}

/// Kernel ids, to find each kernel's state in a workspace.
static KERNELS: AtomicU64 = AtomicU64::new(0);

/// A user's kernel made a [`DeviceKernel`].
struct UserKernel<K: CudaKernel> {
    device: Arc<CudaDevice>,
    kernel: K,
    /// The state of calls outside any run (a kernel run by hand, not by a plan): it lives as
    /// long as the kernel.
    outside: Mutex<Option<K::State>>,
    id: u64,
    tensors: Tensors,
    lengths: BufferLengths,
    range: Option<PreparedRegionRange>,
    executor: String,
    symbol: String,
}

/// The [`DeviceKernel`] that runs `kernel` for `op` (claimed by the executor named
/// `executor`) on `device`, for [`Executor::compile_device`](crate::Executor::compile_device)
/// to return: it records the op's dtypes and shapes, checks the buffers of each run against
/// them, hands `kernel` a [`CudaRun`] on the run's stream with the state of the run's
/// workspace, and pushes the op's range where the executor declared that it emits it (see
/// [`CudaKernel`] for the contract).
///
/// # Errors
/// [`Error::InvalidLabel`] when the op's range cannot be prepared; a malformed op's error.
pub fn device_kernel<K: CudaKernel>(
    device: &Arc<CudaDevice>,
    executor: &str,
    op: &OpView<'_>,
    kernel: K,
) -> Result<Box<dyn DeviceKernel>> {
    let bsym = op.bound_symbol();
    let tensor = |v| -> Result<(DType, Vec<usize>)> { Ok((op.dtype_of(v), op.shape_of(v)?.to_vec())) };
    let inputs = bsym.inputs().map(tensor).collect::<Result<Vec<_>>>()?;
    let outputs = bsym.outputs().iter().map(|&v| tensor(v)).collect::<Result<Vec<_>>>()?;
    let words = |t: &(DType, Vec<usize>)| packing::words(t.0, t.1.iter().product());
    let lengths =
        BufferLengths { inputs: inputs.iter().map(words).collect(), outputs: outputs.iter().map(words).collect() };
    Ok(Box::new(UserKernel {
        device: device.clone(),
        kernel,
        outside: Mutex::new(None),
        id: KERNELS.fetch_add(1, Ordering::Relaxed),
        tensors: Tensors { inputs, outputs },
        lengths,
        range: op.region_range().map(|r| r.prepare()).transpose()?,
        executor: executor.to_string(),
        symbol: op.name().to_string(),
    }))
}

impl<K: CudaKernel> UserKernel<K> {
    fn call(&self, inputs: &[&dyn DeviceBuffer], outputs: &mut [&mut dyn DeviceBuffer]) -> Result<()> {
        self.lengths.check_for(&self.executor, &self.symbol, inputs, outputs)?;
        // One look at this thread's queues for the run's queue, its stream and the state.
        let queue = match self.device.run_place() {
            RunPlace::Run(queue) => Some(queue),
            RunPlace::Outside => None,
            RunPlace::InAnotherDevicesRun => {
                return Err(Error::Execution {
                    executor: self.executor.clone(),
                    symbol: self.symbol.clone(),
                    message: format!(
                        "its kernel was made for {} but runs in a plan on another device; give `device_kernel` the \
                         CudaDevice that the executor's `Executor::device` returns",
                        Device::name(&*self.device)
                    ),
                })
            }
        };
        let own;
        let stream = match &queue {
            Some(queue) => &queue.stream,
            None => {
                own = self.device.own_stream();
                &*own
            }
        };
        let mut run = CudaRun {
            device: &self.device,
            stream,
            inputs: inputs.iter().map(|b| slice(*b)).collect::<Result<_>>()?,
            outputs: outputs.iter_mut().map(|b| slice_mut(&mut **b)).collect::<Result<_>>()?,
            tensors: &self.tensors,
            executor: &self.executor,
            symbol: &self.symbol,
        };
        let Some(queue) = &queue else {
            // Outside any run: the kernel's own state.
            let mut outside = self.outside.lock().unwrap_or_else(|p| p.into_inner());
            if outside.is_none() {
                *outside = Some(self.kernel.new_state(&run)?);
            }
            let state = outside.as_mut().ok_or_else(|| run.error("no state"))?;
            return self.kernel.run(&mut run, state);
        };
        let taken = queue.take_state(self.id);
        let mut state: Box<dyn Any + Send> = match taken {
            Some(state) => state,
            None => Box::new(self.kernel.new_state(&run)?),
        };
        // Out of the workspace while the user's code runs (which may run other kernels of its
        // own), then put back; a kernel that panics loses it, and makes a new one next time.
        let result = match state.downcast_mut::<K::State>() {
            Some(typed) => self.kernel.run(&mut run, typed),
            None => Err(run.error("the workspace holds a state of another type for this kernel")),
        };
        queue.put_state(self.id, state);
        result
    }
}

impl<K: CudaKernel> DeviceKernel for UserKernel<K> {
    fn run(&self, inputs: &[&dyn DeviceBuffer], outputs: &mut [&mut dyn DeviceBuffer]) -> Result<()> {
        match &self.range {
            Some(range) => range.in_scope(|| self.call(inputs, outputs)),
            None => self.call(inputs, outputs),
        }
    }

    fn launch_note(&self) -> Option<String> {
        self.kernel.launch_note()
    }
}
