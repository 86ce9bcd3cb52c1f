//! The executor contract: which bound symbols an executor claims, and the kernels it compiles
//! for them.
//!
//! Executors are asked once, when a plan is compiled; what they return is a [`Kernel`] that
//! has already done all per-op analysis (broadcast strides, generated code, ...), so that
//! running it is only the computation.

use std::fmt;

use crate::core::ir::{Arg, BoundSymbol, Category, Symbol, SymbolId, Trace, ValueId};
use crate::core::tensor::{TensorMut, TensorRef};
use crate::error::{Error, Result};

/// A compiled bound symbol, ready to run many times (from several threads at once).
pub trait Kernel: Send + Sync {
    /// Computes the outputs from the inputs. Inputs are the bound symbol's tensor arguments in
    /// order; outputs are pre-sized to the shapes the trace declares.
    fn run(&self, inputs: &[TensorRef<'_>], outputs: &mut [TensorMut<'_>]) -> Result<()>;
}

/// A kernel made from a closure.
///
/// ```
/// use boundscope::{kernel_fn, Kernel, Tensor, TensorMut};
/// let double = kernel_fn(|inputs, outputs| {
///     for (o, x) in outputs[0].data.iter_mut().zip(inputs[0].data) {
///         *o = 2.0 * x;
///     }
///     Ok(())
/// });
/// let x = Tensor::new(&[2], vec![1.0, 2.0]).unwrap();
/// let mut out = [0.0; 2];
/// double.run(&[x.view()], &mut [TensorMut { shape: &[2], data: &mut out }]).unwrap();
/// assert_eq!(out, [2.0, 4.0]);
/// ```
pub fn kernel_fn<F>(f: F) -> Box<dyn Kernel>
where
    F: Fn(&[TensorRef<'_>], &mut [TensorMut<'_>]) -> Result<()> + Send + Sync + 'static,
{
    struct FnKernel<F>(F);
    impl<F> Kernel for FnKernel<F>
    where
        F: Fn(&[TensorRef<'_>], &mut [TensorMut<'_>]) -> Result<()> + Send + Sync,
    {
        fn run(&self, inputs: &[TensorRef<'_>], outputs: &mut [TensorMut<'_>]) -> Result<()> {
            (self.0)(inputs, outputs)
        }
    }
    Box::new(FnKernel(f))
}

/// Runs bound symbols. A plan asks each executor in its list, in order, whether it claims a
/// bound symbol; the first that does compiles a kernel for it.
///
/// ```
/// use std::sync::Arc;
/// use boundscope::{kernel_fn, prims, Arena, Executor, Kernel, OpView, Plan, Registry, Result, Tensor, TraceBuilder};
///
/// /// Runs only `relu`, and counts nothing: the smallest possible executor.
/// struct ReluOnly;
/// impl Executor for ReluOnly {
///     fn name(&self) -> &str { "relu_only" }
///     fn claims(&self, op: &OpView<'_>) -> bool { op.symbol_id() == prims::RELU }
///     fn compile(&self, _op: &OpView<'_>) -> Result<Box<dyn Kernel>> {
///         Ok(kernel_fn(|inputs, outputs| {
///             for (o, x) in outputs[0].data.iter_mut().zip(inputs[0].data) { *o = x.max(0.0); }
///             Ok(())
///         }))
///     }
/// }
///
/// let registry = Registry::with_builtins();
/// let arena = Arena::new();
/// let mut b = TraceBuilder::new(&arena, &registry);
/// let x = b.input(&[3]).unwrap();
/// let y = b.relu(x).unwrap();
/// b.output(y).unwrap();
/// let trace = b.finish().unwrap();
/// let plan = Plan::compile(&trace, &[Arc::new(ReluOnly)]).unwrap();
/// let out = plan.run(&[&Tensor::new(&[3], vec![-1.0, 0.5, 2.0]).unwrap()]).unwrap();
/// assert_eq!(out[0].data(), &[0.0, 0.5, 2.0]);
/// ```
pub trait Executor: Send + Sync {
    /// A short, unique name (used in listings and errors).
    fn name(&self) -> &str;

    /// Whether this executor runs this bound symbol.
    fn claims(&self, op: &OpView<'_>) -> bool;

    /// Compiles a kernel for a bound symbol that [`claims`](Self::claims) accepted.
    ///
    /// # Errors
    /// Whatever stops the executor from running it; the plan fails to compile with it.
    fn compile(&self, op: &OpView<'_>) -> Result<Box<dyn Kernel>>;
}

/// What an executor sees of one bound symbol when it is asked to claim and compile it.
#[derive(Clone, Copy)]
pub struct OpView<'t> {
    pub(crate) trace: &'t Trace<'t>,
    pub(crate) bound_symbol: &'t BoundSymbol<'t>,
    pub(crate) symbol: &'t Symbol,
}

impl<'t> OpView<'t> {
    pub(crate) fn new(trace: &'t Trace<'t>, bound_symbol: &'t BoundSymbol<'t>) -> Result<Self> {
        let symbol = trace.registry().get(bound_symbol.symbol())?.symbol;
        Ok(Self { trace, bound_symbol, symbol })
    }

    /// The registry the trace's symbols come from.
    pub fn registry(&self) -> &'t crate::core::ir::Registry {
        self.trace.registry()
    }

    /// The symbol's id.
    pub fn symbol_id(&self) -> SymbolId {
        self.bound_symbol.symbol()
    }

    /// The symbol's definition.
    pub fn symbol(&self) -> &'t Symbol {
        self.symbol
    }

    /// The symbol's name.
    pub fn name(&self) -> &'t str {
        &self.symbol.name
    }

    /// The symbol's category.
    pub fn category(&self) -> Category {
        self.symbol.category
    }

    /// The bound symbol itself.
    pub fn bound_symbol(&self) -> &'t BoundSymbol<'t> {
        self.bound_symbol
    }

    /// All arguments, in order.
    pub fn args(&self) -> &'t [Arg<'t>] {
        self.bound_symbol.args()
    }

    /// The shape of a value of the trace.
    pub fn shape_of(&self, value: ValueId) -> Result<&'t [usize]> {
        self.trace
            .meta(value)
            .map(|m| m.shape)
            .ok_or(Error::UndefinedValue { value, used_by: self.symbol.name.clone() })
    }

    /// The shape of the `i`-th tensor argument.
    pub fn input_shape(&self, i: usize) -> Result<&'t [usize]> {
        let value =
            self.bound_symbol.inputs().nth(i).ok_or_else(|| self.missing(i, "a tensor (counting tensors only)"))?;
        self.shape_of(value)
    }

    /// The shape of the `i`-th output.
    pub fn output_shape(&self, i: usize) -> Result<&'t [usize]> {
        let value = *self.bound_symbol.outputs().get(i).ok_or_else(|| Error::MalformedTrace {
            position: None,
            detail: format!("`{}` has no output {i}", self.symbol.name),
        })?;
        self.shape_of(value)
    }

    /// The `i`-th argument (of any kind) as a scalar.
    pub fn scalar(&self, i: usize) -> Result<f32> {
        match self.args().get(i) {
            Some(Arg::Scalar(s)) => Ok(*s),
            _ => Err(self.missing(i, "a scalar")),
        }
    }

    /// The `i`-th argument (of any kind) as a dimension list.
    pub fn dims(&self, i: usize) -> Result<&'t [usize]> {
        match self.args().get(i) {
            Some(Arg::Dims(d)) => Ok(d),
            _ => Err(self.missing(i, "a list of dimensions")),
        }
    }

    fn missing(&self, position: usize, expected: &'static str) -> Error {
        Error::ArgumentKind {
            symbol: self.symbol.name.clone(),
            position,
            expected,
            got: self.args().get(position).map_or("nothing", Arg::kind_name),
        }
    }
}

impl fmt::Debug for OpView<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpView").field("symbol", &self.symbol.name).field("args", &self.args()).finish()
    }
}
