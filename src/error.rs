//! The one error type of boundscope, and its `Result` alias.
//!
//! Every variant names what was wrong and what to do instead, so that a message printed to a
//! user is enough to fix the input without reading our source.

use std::fmt;

use crate::core::ir::ValueId;

/// The result type of every fallible boundscope call.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong when building, transforming, compiling or running a trace.
///
/// ```
/// use boundscope::{Arena, Error, Registry, TraceBuilder};
///
/// let registry = Registry::with_builtins();
/// let arena = Arena::new();
/// let mut builder = TraceBuilder::new(&arena, &registry);
/// let a = builder.input(&[2, 3]).unwrap();
/// let b = builder.input(&[4, 3]).unwrap();
/// let err = builder.add(a, b).unwrap_err();
/// assert!(matches!(err, Error::ShapeMismatch { .. }));
/// assert!(err.to_string().contains("[2, 3]"));
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Error {
    /// A bound symbol (or the trace's output list) refers to a value that is not defined before
    /// it: it does not exist, it is defined later, or it is internal to a composite's
    /// decomposition.
    UndefinedValue {
        /// The value that was referred to.
        value: ValueId,
        /// Where it was used (`add`, `trace output`, ...).
        used_by: String,
    },
    /// A symbol was applied to the wrong number of arguments.
    ArityMismatch {
        /// The symbol's name.
        symbol: String,
        /// How many arguments the symbol takes, e.g. `2` or `2 to 3`.
        expected: String,
        /// How many it was given.
        got: usize,
    },
    /// An argument has the wrong kind (a scalar where a tensor is expected, ...).
    ArgumentKind {
        /// The symbol's name.
        symbol: String,
        /// Zero-based argument position.
        position: usize,
        /// What the symbol expects there.
        expected: &'static str,
        /// What it was given.
        got: &'static str,
    },
    /// The shapes given to an op do not fit its shape rule.
    ShapeMismatch {
        /// The symbol's name.
        symbol: String,
        /// The shapes of the op's tensor arguments, in order.
        shapes: Vec<Vec<usize>>,
        /// Why they do not fit.
        detail: String,
    },
    /// No symbol with this name (or id) is registered.
    UnknownSymbol {
        /// The name that was asked for.
        name: String,
        /// The closest registered name, if one is close.
        suggestion: Option<String>,
    },
    /// A dtype name that is not one of boundscope's.
    UnknownDType {
        /// The name given.
        name: String,
        /// The names it knows.
        known: Vec<String>,
    },
    /// No executor of the plan runs this bound symbol at its dtypes (found when the plan is
    /// compiled).
    UnsupportedDType {
        /// The symbol.
        symbol: String,
        /// The dtype no executor that would run the symbol takes.
        dtype: crate::DType,
        /// The executors tried, in order, with the dtypes each takes.
        tried: Vec<String>,
    },
    /// A run was given a tensor of another dtype than the plan's input.
    InputDType {
        /// Its index.
        index: usize,
        /// The dtype the plan was compiled for.
        expected: crate::DType,
        /// The dtype given.
        got: crate::DType,
    },
    /// A symbol with this name is already registered.
    DuplicateSymbol {
        /// The name registered twice.
        name: String,
    },
    /// A symbol definition is incomplete or inconsistent.
    InvalidSymbol {
        /// The symbol's name.
        symbol: String,
        /// What is wrong with it.
        detail: String,
    },
    /// `passes::Grad` met a symbol on the path from a parameter to the loss that has no
    /// gradient rule ([`Symbol::vjp`](crate::Symbol::vjp)) and no decomposition to
    /// differentiate through, or whose rule returned gradients that do not fit its arguments.
    NoGradient {
        /// The symbol's name.
        symbol: String,
        /// What is missing or wrong.
        detail: String,
    },
    /// A gradient was asked for something that has none: a loss that is not one float
    /// element, a parameter that is not a float input of the trace, a trace already fused.
    InvalidGradient {
        /// What is wrong and what to do instead.
        detail: String,
    },
    /// An in-place update ([`TraceBuilder::update`](crate::TraceBuilder::update)) that cannot
    /// be: not of an input, of an input twice, or of another dtype or shape; or a run that
    /// cannot write one back.
    InvalidUpdate {
        /// What is wrong and what to do instead.
        detail: String,
    },
    /// No executor in the plan's list can run this prim, and it has no decomposition.
    NoExecutor {
        /// The symbol that nobody claimed.
        symbol: String,
        /// The executors that were asked, in order.
        tried: Vec<String>,
    },
    /// An executor refused to compile a bound symbol because its arguments or shapes break a
    /// relation the executor's kernel relies on: a built-in prim whose shapes do not follow the
    /// built-in's own rule, or a fusion region whose inputs or ops do not fit its iteration
    /// shape. Checked when the plan is compiled, so that no kernel reads or writes out of
    /// bounds; it arises from bound symbols copied between traces of other shapes.
    KernelPrecondition {
        /// The executor's name.
        executor: String,
        /// The bound symbol's name (a region's own name, such as `CpuFusion0`).
        symbol: String,
        /// Which relation does not hold.
        detail: String,
    },
    /// A trace does not satisfy the IR's rules (found by `Trace::verify`).
    MalformedTrace {
        /// Index of the offending top-level bound symbol, if the problem is in one.
        position: Option<usize>,
        /// What is wrong.
        detail: String,
    },
    /// An input given on the device that this plan cannot read there.
    InputPlacement {
        /// Its index.
        index: usize,
        /// Why, and what to do instead.
        detail: String,
    },
    /// A plan that cannot be captured as a graph, or a graph replayed with other inputs than
    /// those it captured.
    GraphUnsupported {
        /// Why, and what to do instead.
        reason: String,
    },
    /// Two executors of one plan run on different devices (or different handles of one).
    DeviceMismatch {
        /// The first executor with a device.
        first: String,
        /// Its device's name.
        first_device: String,
        /// An executor on another device.
        second: String,
        /// Its device's name (the same name when they are two handles of one device).
        second_device: String,
    },
    /// An output index past a run's outputs.
    NoSuchOutput {
        /// The index asked for.
        index: usize,
        /// How many outputs there are.
        outputs: usize,
    },
    /// Two guard spans overlap without one containing the other (a pass's position map moved
    /// them so): ranges must nest, or the run would exit the wrong one.
    OverlappingGuards {
        /// The outer span, as `label over steps a..b` (or positions, from a pass).
        first: String,
        /// The span that starts inside it and ends after it.
        second: String,
    },
    /// A shape that cannot be used: the product of its non-zero dimensions is more than a
    /// buffer can hold (see [`checked_numel`](crate::checked_numel)).
    InvalidShape {
        /// The shape.
        shape: Vec<usize>,
        /// What is wrong with it.
        detail: String,
    },
    /// A buffer of a usable shape could not be allocated: the machine does not have the
    /// memory.
    OutOfMemory {
        /// What allocates it (`Tensor`, `Plan::workspace`, ...).
        what: String,
        /// The shape of the buffer.
        shape: Vec<usize>,
        /// The bytes asked for.
        bytes: usize,
    },
    /// A tensor's values were asked for as another element type than its dtype's (for example
    /// `values::<f32>()` on an `i64` tensor).
    DTypeMismatch {
        /// What was asked: a tensor, a kernel's input or output.
        what: String,
        /// The dtype asked for.
        expected: crate::DType,
        /// The tensor's dtype.
        got: crate::DType,
    },
    /// An integer id given to a run (an `embedding` row, a `gather_last` or `cross_entropy`
    /// index) lies outside the axis it indexes.
    IndexOutOfRange {
        /// The op the ids were given to: where a step of a composite's decomposition reads
        /// them (`cross_entropy`'s `gather_last` on the CPU), the composite (the innermost,
        /// where composites nest), as where an executor runs it whole. (A trace decomposed
        /// before it was planned, by the `Decompose` pass, has no composite left to name.)
        symbol: String,
        /// The id.
        index: i64,
        /// Where it is among the ids (flat, row-major).
        position: usize,
        /// The size of the axis it indexes: valid ids are `0..bound`.
        bound: usize,
    },
    /// A tensor's data length does not match its shape.
    InvalidTensor {
        /// The shape given.
        shape: Vec<usize>,
        /// The number of elements given.
        len: usize,
    },
    /// `Plan::run` got the wrong number of inputs.
    InputCount {
        /// How many inputs the trace declares.
        expected: usize,
        /// How many were given.
        got: usize,
    },
    /// An input to `Plan::run` has the wrong shape.
    InputShape {
        /// Zero-based input position.
        index: usize,
        /// The shape the trace declares.
        expected: Vec<usize>,
        /// The shape given.
        got: Vec<usize>,
    },
    /// An input to `Plan::run_with` has the right shape but not as many elements as its shape
    /// holds (a [`TensorRef`](crate::TensorRef) built by hand).
    InputLength {
        /// Zero-based input position.
        index: usize,
        /// Its shape (the one the trace declares).
        shape: Vec<usize>,
        /// How many elements the shape holds.
        expected: usize,
        /// How many its data has.
        got: usize,
    },
    /// A copy between host and device memory ([`Device::upload`](crate::Device::upload),
    /// [`Device::download`](crate::Device::download)) whose device buffer is shorter than the
    /// host data, or a copy on the device ([`Device::copy`](crate::Device::copy)) from a buffer
    /// shorter than its target (then `host` is the target's length).
    TransferLength {
        /// `upload`, `download` or `copy`.
        direction: &'static str,
        /// The host data's length, in device words (`f32` elements).
        host: usize,
        /// The device buffer's length, in device words.
        device: usize,
    },
    /// [`DeviceTensor::copy_from_host`](crate::DeviceTensor::copy_from_host) got data of
    /// another shape or dtype than the tensor's.
    CopyMismatch {
        /// The device tensor's dtype and shape.
        expected: crate::TensorMeta,
        /// The host data's.
        got: crate::TensorMeta,
    },
    /// A workspace made by one plan was passed to another.
    WorkspaceMismatch,
    /// A bound-symbol position past the end of the trace.
    InvalidBoundSymbol {
        /// The position asked for.
        index: usize,
        /// How many top-level bound symbols the trace has.
        len: usize,
    },
    /// A range of bound-symbol positions whose start is after its end
    /// (`Selection::Positions(3..1)`).
    ReversedRange {
        /// The range's start.
        start: usize,
        /// The range's end.
        end: usize,
    },
    /// A subsymbol depth that the composite does not have.
    DepthOutOfRange {
        /// The composite's position.
        op: usize,
        /// The depth asked for.
        depth: usize,
        /// The deepest level of its decomposition (0 for a prim).
        max: usize,
    },
    /// A guard label (or domain name) that cannot be used.
    InvalidLabel {
        /// The label, escaped.
        label: String,
        /// What is wrong with it.
        detail: String,
    },
    /// A scope name that cannot be used (empty, with a NUL, a `.` or a `*`).
    InvalidScopeName {
        /// The name, escaped.
        name: String,
        /// What is wrong with it.
        detail: String,
    },
    /// [`TraceBuilder::exit_scope`](crate::TraceBuilder::exit_scope) with no scope open, or a
    /// trace finished with scopes still open.
    UnbalancedScope {
        /// What is unbalanced, and how to fix it.
        detail: String,
    },
    /// A scope pattern that matches no scope of the trace.
    NoSuchScope {
        /// The pattern.
        pattern: String,
        /// Some of the trace's scope paths (empty: it has none).
        known: Vec<String>,
    },
    /// No option has this name.
    UnknownOption {
        /// The name asked for.
        name: String,
        /// The closest option name, if one is close.
        suggestion: Option<String>,
    },
    /// A value that does not fit an option's type or range.
    InvalidOptionValue {
        /// The option.
        name: String,
        /// What it accepts.
        expected: String,
        /// What it was given.
        got: String,
    },
    /// A developer option set through the user API.
    DeveloperOption {
        /// The option.
        name: String,
    },
    /// An option declared again with another type, default, audience or environment variable
    /// (two executors that chose the same name).
    ConflictingOption {
        /// The option.
        name: String,
        /// How the two specs differ.
        detail: String,
    },
    /// An environment variable with a value the front end does not accept (never ignored).
    InvalidEnvironment {
        /// The variable.
        variable: String,
        /// Its value.
        value: String,
        /// What it accepts.
        expected: String,
    },
    /// A `BOUNDSCOPE_*` environment variable that the front end does not read: a typo, or a
    /// variable of another version (never ignored).
    UnknownEnvironmentVariable {
        /// The variable.
        variable: String,
        /// The closest variable the front end reads, if one is close.
        suggestion: Option<String>,
        /// Every variable the front end reads.
        known: Vec<String>,
    },
    /// A directory that a file was to be written into cannot be made or written
    /// ([`Timeline::write_chrome_trace`](crate::guards::Timeline::write_chrome_trace)): a path
    /// under a regular file, a directory without write permission, a full disk.
    UnwritableDirectory {
        /// The directory, as given.
        directory: String,
        /// What the operating system said.
        detail: String,
    },
    /// A file that cannot be written
    /// ([`Recorder::write_chrome_trace`](crate::guards::Recorder::write_chrome_trace)).
    UnwritableFile {
        /// The file, as given.
        path: String,
        /// What the operating system said.
        detail: String,
    },
    /// Two executors of a plan's list share a name, or one has none: listings, notes, range
    /// filters and errors name executors by [`Executor::name`](crate::Executor::name), which must
    /// be unique and not empty.
    ExecutorName {
        /// The name (empty for an executor without one).
        name: String,
        /// What is wrong, and the fix.
        detail: String,
    },
    /// An executor the plan requires cannot run on this machine.
    ExecutorUnavailable {
        /// The executor.
        executor: String,
        /// Why not.
        reason: String,
    },
    /// An executor failed while running a bound symbol.
    Execution {
        /// The executor's name.
        executor: String,
        /// The symbol it was running.
        symbol: String,
        /// What went wrong.
        message: String,
    },
    /// A collective ([`crate::distributed`]) failed on this rank: the ranks disagree on what
    /// to run (the op, the number of values, the root), a rank did not arrive within the
    /// communicator's timeout (it failed or hangs), or the communicator was aborted by an earlier
    /// failure. Every rank of the group gets one; none hangs.
    Collective {
        /// The communicator's name.
        communicator: String,
        /// This process's (or thread's) rank in it.
        rank: usize,
        /// What went wrong and what to do instead.
        detail: String,
    },
    /// A checkpoint file ([`crate::checkpoint`]) could not be read or written, or one of its
    /// tensors is missing or not what the caller expects.
    Checkpoint {
        /// The file.
        path: String,
        /// The tensor concerned, when the problem is one tensor's.
        tensor: Option<String>,
        /// What is wrong and what to do instead.
        detail: String,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::UndefinedValue { value, used_by } => write!(
                f,
                "`{used_by}` uses {value}, which is not defined before it; \
                 pass a value returned by an earlier builder call or a trace input"
            ),
            Error::ArityMismatch { symbol, expected, got } => write!(
                f,
                "`{symbol}` takes {expected} argument(s) but was given {got}; \
                 see the symbol's signature in `Registry::get`"
            ),
            Error::ArgumentKind { symbol, position, expected, got } => {
                write!(f, "argument {position} of `{symbol}` must be {expected}, but a {got} was given")
            }
            Error::ShapeMismatch { symbol, shapes, detail } => {
                write!(f, "shape mismatch in `{symbol}` for input shapes ")?;
                write_shapes(f, shapes)?;
                write!(f, ": {detail}")
            }
            Error::UnknownDType { name, known } => {
                write!(f, "unknown dtype `{name}`; use one of {}", known.join(", "))
            }
            Error::IndexOutOfRange { symbol, index, position, bound } => {
                write!(
                    f,
                    "`{symbol}` was given id {index} at position {position}, outside 0..{bound}; ids index an axis \
                     of size {bound} (check the ids, or the size of the table they index)"
                )?;
                if *index < 0 {
                    // PyTorch's `cross_entropy(ignore_index=-100)`, the usual source of one.
                    f.write_str(
                        "; negative ids are not skipped (PyTorch skips `ignore_index`, -100): give those rows an \
                         id in range and mask what they give (`where_scalar`)",
                    )?;
                }
                Ok(())
            }
            Error::DTypeMismatch { what, expected, got } => write!(
                f,
                "{what} holds {got} values, not {expected}; read it as {got} (`values::<{}>()`, or match on its \
                 `data`), or convert it first (`to_dtype`, or a `cast` in the trace)",
                got.rust_type()
            ),
            Error::UnsupportedDType { symbol, dtype, tried } => write!(
                f,
                "no executor runs `{symbol}` in {dtype} (tried: {}); add an executor that takes {dtype} (the CPU \
                 executors take every dtype), or cast to a dtype one of these takes",
                tried.join("; ")
            ),
            Error::InputDType { index, expected, got } => write!(
                f,
                "input {index} is {got}, but the plan was compiled for {expected}; convert it first \
                 (`Tensor::to_dtype({expected})`) or compile the plan for {got}"
            ),
            Error::UnknownSymbol { name, suggestion } => {
                write!(f, "unknown symbol `{name}`")?;
                if let Some(s) = suggestion {
                    write!(f, "; did you mean `{s}`?")?;
                }
                if crate::prims::BUILTIN_NAMES.contains(&name.as_str()) {
                    write!(f, " (a built-in symbol: make the registry with `Registry::with_builtins()`)")
                } else {
                    write!(f, " (register it with `Registry::register`, or list names with `Registry::names`)")
                }
            }
            Error::DuplicateSymbol { name } => {
                write!(f, "a symbol named `{name}` is already registered; pick another name")
            }
            Error::InvalidSymbol { symbol, detail } => {
                write!(f, "invalid definition of symbol `{symbol}`: {detail}")
            }
            Error::NoGradient { symbol, detail } => write!(
                f,
                "no gradient for `{symbol}`: {detail}; give the symbol a gradient rule (`Symbol::vjp`) or a \
                 decomposition into symbols that have one"
            ),
            Error::InvalidGradient { detail } => write!(f, "cannot take this gradient: {detail}"),
            Error::InvalidUpdate { detail } => write!(f, "invalid in-place update: {detail}"),
            Error::NoExecutor { symbol, tried } => write!(
                f,
                "no executor can run `{symbol}` (tried: {}); add an executor that claims it, \
                 or give the symbol a decomposition",
                if tried.is_empty() { "none, the executor list is empty".to_string() } else { tried.join(", ") }
            ),
            Error::KernelPrecondition { executor, symbol, detail } => write!(
                f,
                "executor `{executor}` cannot compile `{symbol}`: {detail}; build the op with `TraceBuilder` \
                 (and regions with `passes::FuseRegions`) on the trace that runs it, rather than copying it \
                 from a trace of other shapes"
            ),
            Error::MalformedTrace { position, detail } => match position {
                Some(p) => write!(f, "malformed trace at bound symbol {p}: {detail}"),
                None => write!(f, "malformed trace: {detail}"),
            },
            Error::InputPlacement { index, detail } => {
                write!(f, "input {index} cannot be read on the device: {detail}")
            }
            Error::GraphUnsupported { reason } => write!(f, "cannot use a graph here: {reason}"),
            Error::CopyMismatch { expected, got } => write!(
                f,
                "cannot copy {got} host data into a device tensor of {expected}: give data of its dtype and shape \
                 (`Tensor::to_dtype` converts), or upload a new tensor (`DeviceTensor::upload`)"
            ),
            Error::TransferLength { direction: "copy", host, device } => write!(
                f,
                "a copy of {host} words on the device from a buffer of {device}: the source must hold at least as \
                 many words as the target"
            ),
            Error::TransferLength { direction, host, device } => write!(
                f,
                "an {direction} of {host} words {} a device buffer of {device}: the device buffer must hold at \
                 least as many words as the host data (allocate it with `Device::alloc({host})`, or copy \
                 {device} words)",
                if *direction == "upload" { "into" } else { "from" }
            ),
            Error::DeviceMismatch { first, first_device, second, second_device } => {
                let what = if first_device == second_device {
                    format!("two device objects that are both named `{first_device}`")
                } else {
                    format!("`{first_device}` and `{second_device}`")
                };
                write!(
                    f,
                    "executors `{first}` and `{second}` run on {what}; a plan runs on one device: give them the same \
                     device handle (one `Arc`; `CudaDevice::new` returns the process's handle of a GPU)"
                )
            }
            Error::NoSuchOutput { index, outputs } => {
                write!(f, "there is no output {index}: the plan has {outputs} (0..{outputs})")
            }
            Error::OverlappingGuards { first, second } => write!(
                f,
                "guard spans overlap: {second} starts inside {first} and ends after it; guards must nest \
                 (a pass's position map must keep the bound symbols a guard spans together)"
            ),
            Error::InvalidShape { shape, detail } => write!(f, "shape {shape:?} cannot be used: {detail}"),
            Error::OutOfMemory { what, shape, bytes } => write!(
                f,
                "{what} could not allocate {bytes} bytes for a buffer of shape {shape:?}; use smaller shapes, \
                 or free memory"
            ),
            Error::InvalidTensor { shape, len } => match crate::core::ir::checked_numel(shape) {
                Some(n) => write!(f, "a tensor of shape {shape:?} needs {n} elements, but {len} were given"),
                None => write!(
                    f,
                    "a tensor of shape {shape:?} cannot be used: {}",
                    crate::core::ir::unusable_shape_detail(shape)
                ),
            },
            Error::InputCount { expected, got } => write!(
                f,
                "the plan takes {expected} input(s) but {got} were given; pass them in the order \
                 the trace declared them"
            ),
            Error::InputShape { index, expected, got } => write!(
                f,
                "input {index} has shape {got:?} but the trace was built for {expected:?}; \
                 build a trace (and plan) for this shape"
            ),
            Error::InputLength { index, shape, expected, got } => write!(
                f,
                "input {index} has shape {shape:?}, which holds {expected} elements, but its data has {got}; \
                 give it exactly {expected} (`Tensor::new` checks this)"
            ),
            Error::WorkspaceMismatch => {
                write!(f, "this workspace was made by another plan; make one with `plan.workspace()`")
            }
            Error::InvalidBoundSymbol { index, len } => {
                write!(f, "there is no bound symbol at position {index}: the trace has {len} (positions 0..{len})")
            }
            Error::ReversedRange { start, end } => write!(
                f,
                "the positions {start}..{end} are reversed (the start is after the end), so they select nothing; \
                 write {end}..{start}"
            ),
            Error::DepthOutOfRange { op, depth, max } => {
                if *max == 0 {
                    write!(f, "bound symbol {op} is a prim with no subsymbols; attach to it directly instead")
                } else {
                    write!(
                        f,
                        "depth {depth} is out of range for bound symbol {op}: its decomposition has depths 1..={max}"
                    )
                }
            }
            Error::InvalidLabel { label, detail } => write!(f, "invalid label \"{label}\": {detail}"),
            Error::InvalidScopeName { name, detail } => write!(f, "invalid scope name \"{name}\": {detail}"),
            Error::UnbalancedScope { detail } => write!(f, "unbalanced scopes: {detail}"),
            Error::NoSuchScope { pattern, known } => {
                write!(f, "no scope of the trace matches `{pattern}`")?;
                if known.is_empty() {
                    write!(f, "; the trace has no scopes (build them with `TraceBuilder::scope`)")
                } else {
                    write!(
                        f,
                        "; its scopes include {} (`*` matches within a component, `**` any components)",
                        known.join(", ")
                    )
                }
            }
            Error::UnknownOption { name, suggestion } => {
                write!(f, "unknown option `{name}`")?;
                if let Some(s) = suggestion {
                    write!(f, "; did you mean `{s}`?")?;
                }
                write!(f, " (every option: `boundscope::options::list()`, or `cargo run --example options`)")
            }
            Error::InvalidOptionValue { name, expected, got } => {
                write!(f, "option `{name}` takes {expected}, not `{got}`")
            }
            Error::DeveloperOption { name } => write!(
                f,
                "`{name}` is a developer option; set it with `Options::set_developer` (plans built with it \
                 say so in their listing), or leave it at its default"
            ),
            Error::ConflictingOption { name, detail } => write!(
                f,
                "option `{name}` is declared twice, differently ({detail}); name an executor's options after \
                 it (`owner.name`) so that they do not clash"
            ),
            Error::InvalidEnvironment { variable, value, expected } => {
                write!(f, "environment variable {variable}={value:?} is not accepted: expected {expected}; fix it or unset it")
            }
            Error::UnknownEnvironmentVariable { variable, suggestion, known } => {
                write!(f, "unknown environment variable {variable}")?;
                if let Some(s) = suggestion {
                    write!(f, "; did you mean {s}?")?;
                }
                write!(f, " (boundscope reads {}; rename it or unset it)", known.join(", "))
            }
            Error::UnwritableDirectory { directory, detail } => write!(
                f,
                "cannot write a file into the directory `{directory}`: {detail}; pass a directory that this \
                 process may create and write to (not a path under a regular file)"
            ),
            Error::UnwritableFile { path, detail } => write!(
                f,
                "cannot write the file `{path}`: {detail}; pass a path in a directory that exists and that this \
                 process may write to"
            ),
            Error::ExecutorName { name, detail } => write!(f, "executor name `{name}`: {detail}"),
            Error::ExecutorUnavailable { executor, reason } => write!(
                f,
                "executor `{executor}` is required but unavailable here: {reason}; drop the requirement to fall back \
                 to the CPU executors"
            ),
            Error::Execution { executor, symbol, message } => {
                write!(f, "executor `{executor}` failed running `{symbol}`: {message}")
            }
            Error::Collective { communicator, rank, detail } => {
                write!(f, "collective on communicator `{communicator}`, rank {rank}: {detail}")
            }
            Error::Checkpoint { path, tensor: Some(tensor), detail } => {
                write!(f, "checkpoint `{path}`, tensor `{tensor}`: {detail}")
            }
            Error::Checkpoint { path, tensor: None, detail } => write!(f, "checkpoint `{path}`: {detail}"),
        }
    }
}

fn write_shapes(f: &mut fmt::Formatter<'_>, shapes: &[Vec<usize>]) -> fmt::Result {
    for (i, s) in shapes.iter().enumerate() {
        if i > 0 {
            write!(f, " and ")?;
        }
        write!(f, "{s:?}")?;
    }
    Ok(())
}

impl std::error::Error for Error {}

/// The closest of `candidates` to `name` by edit distance, if it is close enough to be a typo.
pub(crate) fn did_you_mean<'c>(name: &str, candidates: impl Iterator<Item = &'c str>) -> Option<String> {
    let limit = (name.len() / 3).max(2);
    candidates
        .map(|c| (edit_distance(name, c), c))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c.to_string())
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = if ca == *cb { prev } else { 1 + prev.min(cur).min(row[j]) };
            prev = cur;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggests_close_names_only() {
        let names = ["add", "sigmoid", "softmax"];
        assert_eq!(did_you_mean("sigmod", names.iter().copied()), Some("sigmoid".into()));
        assert_eq!(did_you_mean("softmx", names.iter().copied()), Some("softmax".into()));
        assert_eq!(did_you_mean("convolution", names.iter().copied()), None);
    }
}
