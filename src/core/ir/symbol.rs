//! Symbols: the op kinds that bound symbols apply, with their signature, shape rule and
//! optional decomposition and CPU implementation.
//!
//! A [`Symbol`] is a plain description built with chained setters; a
//! [`Registry`](crate::Registry) owns symbols and gives each a [`SymbolId`]. Behaviour is held
//! in `Arc<dyn Fn>` so that users of the library define their own symbols without touching the
//! crate, and built-ins go through exactly the same path.

use std::fmt;
use std::sync::Arc;

use super::bound_symbol::Arg;
use super::builder::TraceBuilder;
use super::ids::{SymbolId, ValueId};
use super::meta::{DType, TensorMeta};
use crate::core::plan::{Kernel, OpView};
use crate::error::Result;

/// What kind of computation a symbol is; executors and passes use it to decide what to claim
/// and fuse.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Category {
    /// One output element per input element (with broadcasting).
    Elementwise,
    /// Reduces an axis.
    Reduction,
    /// Matrix multiplication.
    Matmul,
    /// Changes layout or shape only (reshape, transpose, broadcast).
    Shape,
    /// Defined by a decomposition into other symbols.
    Composite,
    /// A fusion region: ops grouped by a fusion pass, run as one unit by an executor.
    Fusion,
    /// A collective across ranks ([`distributed`](crate::distributed)): `all_reduce`,
    /// `all_gather`, `reduce_scatter`, `broadcast`.
    Collective,
}

impl fmt::Display for Category {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Category::Elementwise => "elementwise",
            Category::Reduction => "reduction",
            Category::Matmul => "matmul",
            Category::Shape => "shape",
            Category::Composite => "composite",
            Category::Fusion => "fusion",
            Category::Collective => "collective",
        })
    }
}

/// The kind of one parameter in a symbol's signature.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParamKind {
    /// A tensor value.
    Tensor,
    /// A tensor value or an `f32` scalar.
    TensorOrScalar,
    /// An `f32` scalar.
    Scalar,
    /// A list of dimensions (a shape or a permutation).
    Dims,
    /// An element type (`cast`'s target).
    DType,
}

impl ParamKind {
    pub(crate) fn describe(self) -> &'static str {
        match self {
            ParamKind::Tensor => "a tensor",
            ParamKind::TensorOrScalar => "a tensor or a scalar",
            ParamKind::Scalar => "a scalar",
            ParamKind::Dims => "a list of dimensions",
            ParamKind::DType => "a dtype",
        }
    }

    pub(crate) fn accepts(self, arg: &Arg<'_>) -> bool {
        matches!(
            (self, arg),
            (ParamKind::Tensor | ParamKind::TensorOrScalar, Arg::Value(_))
                | (ParamKind::TensorOrScalar | ParamKind::Scalar, Arg::Scalar(_))
                | (ParamKind::Dims, Arg::Dims(_))
                | (ParamKind::DType, Arg::DType(_))
        )
    }
}

/// What a shape rule sees of one argument.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ArgInfo<'m> {
    /// A tensor argument's metadata.
    Tensor {
        /// Its element type.
        dtype: DType,
        /// Its shape.
        shape: &'m [usize],
    },
    /// A scalar argument.
    Scalar(f32),
    /// A dimension-list argument.
    Dims(&'m [usize]),
    /// A dtype argument.
    DType(DType),
}

impl<'m> ArgInfo<'m> {
    /// The shape of a tensor argument, `None` for other kinds.
    pub fn shape(&self) -> Option<&'m [usize]> {
        match self {
            ArgInfo::Tensor { shape, .. } => Some(shape),
            _ => None,
        }
    }

    /// The dimensions of a dimension-list argument, `None` for other kinds.
    pub fn dims(&self) -> Option<&'m [usize]> {
        match self {
            ArgInfo::Dims(d) => Some(d),
            _ => None,
        }
    }
}

/// Computes a symbol's output metadata from its arguments, or says why they do not fit.
///
/// The message is wrapped in [`Error::ShapeMismatch`](crate::Error::ShapeMismatch) together
/// with the symbol's name and the input shapes.
pub type ShapeRule = Arc<dyn Fn(&[ArgInfo<'_>]) -> std::result::Result<TensorMeta, String> + Send + Sync>;

/// Emits a composite's decomposition into the builder and returns the value that is its result.
pub type Decomposition = Arc<dyn for<'a> Fn(&mut TraceBuilder<'a>, &[Arg<'a>]) -> Result<ValueId> + Send + Sync>;

/// What a gradient rule ([`Symbol::vjp`]) sees of one bound symbol being differentiated.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct VjpInput<'s, 'a> {
    /// The symbol's name (for errors).
    pub name: &'s str,
    /// The bound symbol's arguments, as it was bound.
    pub args: &'s [Arg<'a>],
    /// The value it defines.
    pub output: ValueId,
    /// The gradient of the loss with respect to `output`: a value of `output`'s shape and
    /// dtype.
    pub cotangent: ValueId,
}

impl VjpInput<'_, '_> {
    /// Tensor argument `i`, if argument `i` is one.
    pub fn value(&self, i: usize) -> Option<ValueId> {
        self.args.get(i).and_then(Arg::value)
    }
}

/// A symbol's vector-Jacobian product: binds, in the builder, the ops that compute the gradient
/// of the loss with respect to each argument from the [`VjpInput`], and returns one entry per
/// argument (`None` for arguments that are not tensors or that no gradient flows to). Each
/// gradient has its argument's shape; `passes::Grad` casts it to the argument's dtype.
pub type VjpRule =
    Arc<dyn for<'a> Fn(&mut TraceBuilder<'a>, &VjpInput<'_, 'a>) -> Result<Vec<Option<ValueId>>> + Send + Sync>;

/// Makes a CPU kernel for one bound symbol of a user-defined symbol (see
/// [`Symbol::cpu_kernel`]).
pub type CpuKernelFactory = Arc<dyn Fn(&OpView<'_>) -> Result<Box<dyn Kernel>> + Send + Sync>;

/// An op kind: name, category, signature, shape rule, and optionally a decomposition into other
/// symbols and a CPU implementation.
///
/// Register it with [`Registry::register`](crate::Registry::register) to use it in traces.
///
/// Executors run a symbol as a built-in prim only if it is one: a copy of a built-in (from
/// [`Registry::with_builtins`](crate::Registry::with_builtins)) stays one until a setter
/// changes it; a symbol of your own is never one, whatever its name.
///
/// ```
/// use boundscope::{kernel_fn, Arena, Category, ParamKind, Registry, Symbol, Tensor, TraceBuilder};
/// use boundscope::{executors::CpuReference, Plan};
///
/// // A user-defined elementwise op, `square`, with its own CPU implementation.
/// let square = Symbol::new("square", Category::Elementwise)
///     .params(&[ParamKind::Tensor])
///     .same_shape_as_first()
///     .cpu_kernel(|_op| {
///         Ok(kernel_fn(|inputs, outputs| {
///             for (o, x) in outputs[0].values_mut::<f32>()?.iter_mut().zip(inputs[0].values::<f32>()?) {
///                 *o = x * x;
///             }
///             Ok(())
///         }))
///     });
/// let mut registry = Registry::with_builtins();
/// let square_id = registry.register(square).unwrap();
///
/// let arena = Arena::new();
/// let mut b = TraceBuilder::new(&arena, &registry);
/// let x = b.input(&[3]).unwrap();
/// let y = b.bind(square_id, &[x.into()]).unwrap();
/// b.output(y).unwrap();
/// let trace = b.finish().unwrap();
///
/// let plan = Plan::compile(&trace, &[CpuReference::shared()]).unwrap();
/// let out = plan.run(&[&Tensor::new(&[3], vec![1.0, 2.0, 3.0]).unwrap()]).unwrap();
/// assert_eq!(out[0].to_f32_vec(), &[1.0, 4.0, 9.0]);
/// ```
#[derive(Clone)]
pub struct Symbol {
    pub(crate) name: String,
    pub(crate) category: Category,
    pub(crate) params: Vec<ParamKind>,
    pub(crate) required: usize,
    pub(crate) shape_rule: Option<ShapeRule>,
    pub(crate) decomposition: Option<Decomposition>,
    pub(crate) cpu_kernel: Option<CpuKernelFactory>,
    pub(crate) vjp: Option<VjpRule>,
    /// The built-in prim this symbol is, set only by the registration of the built-ins (see
    /// [`Registry::with_builtins`](crate::Registry::with_builtins)) and cleared by every setter:
    /// executors recognise built-ins by it, never by name, which a symbol of one's own may
    /// share (a registry gives a built-in's id only to a copy of it).
    pub(crate) builtin: Option<SymbolId>,
}

impl Symbol {
    /// A symbol with this name and category, no parameters and no rules yet.
    pub fn new(name: impl Into<String>, category: Category) -> Self {
        Self {
            name: name.into(),
            category,
            params: Vec::new(),
            required: 0,
            shape_rule: None,
            decomposition: None,
            cpu_kernel: None,
            vjp: None,
            builtin: None,
        }
    }

    /// Its parameters, all required.
    pub fn params(mut self, params: &[ParamKind]) -> Self {
        self.builtin = None;
        self.params = params.to_vec();
        self.required = params.len();
        self
    }

    /// Its parameters, of which the first `required` must be given and the rest may be left off
    /// from the end.
    pub fn params_with_optional(mut self, params: &[ParamKind], required: usize) -> Self {
        self.builtin = None;
        self.params = params.to_vec();
        self.required = required.min(params.len());
        self
    }

    /// Its shape rule.
    pub fn shape_rule(
        mut self,
        rule: impl Fn(&[ArgInfo<'_>]) -> std::result::Result<TensorMeta, String> + Send + Sync + 'static,
    ) -> Self {
        self.builtin = None;
        self.shape_rule = Some(Arc::new(rule));
        self
    }

    /// The common shape rule: the output has the first argument's dtype and shape.
    pub fn same_shape_as_first(self) -> Self {
        self.shape_rule(|args| match args.first() {
            Some(ArgInfo::Tensor { dtype, shape }) => Ok(TensorMeta::new(*dtype, shape)),
            _ => Err("the first argument must be a tensor".into()),
        })
    }

    /// Its decomposition into other symbols (this makes it usable on every executor that runs
    /// those symbols).
    pub fn decomposition(
        mut self,
        decompose: impl for<'a> Fn(&mut TraceBuilder<'a>, &[Arg<'a>]) -> Result<ValueId> + Send + Sync + 'static,
    ) -> Self {
        self.builtin = None;
        self.decomposition = Some(Arc::new(decompose));
        self
    }

    /// Its CPU implementation, used by [`CpuReference`](crate::executors::CpuReference): a
    /// factory called once per bound symbol when a plan is compiled.
    ///
    /// `CpuReference` takes every dtype, so the kernel is given the op's tensors in whatever
    /// dtypes the trace gives them (not only `f32`, as an executor's kernels are by default:
    /// [`Executor::dtypes`](crate::Executor::dtypes)). A kernel written for `f32` alone checks
    /// [`OpView::dtypes`](crate::OpView::dtypes) in the factory and returns an error there
    /// ([`Error::UnsupportedDType`](crate::Error::UnsupportedDType), say), so that the plan
    /// fails to compile naming the op, not its run with a bare
    /// [`Error::DTypeMismatch`](crate::Error::DTypeMismatch).
    pub fn cpu_kernel(
        mut self,
        factory: impl Fn(&OpView<'_>) -> Result<Box<dyn Kernel>> + Send + Sync + 'static,
    ) -> Self {
        self.builtin = None;
        self.cpu_kernel = Some(Arc::new(factory));
        self
    }

    /// Its gradient rule, for [`passes::Grad`](crate::passes::Grad): the ops that compute
    /// the gradient of each argument from the gradient of the output. A symbol without one is
    /// differentiated through its decomposition; a prim without one (and without a
    /// decomposition) on the path from a parameter to the loss is
    /// [`Error::NoGradient`](crate::Error::NoGradient). On a copy of a built-in, the rule
    /// replaces the built-in's rule and the symbol stays a built-in for executors.
    ///
    /// ```
    /// use boundscope::passes::{Grad, Pass};
    /// use boundscope::executors::CpuReference;
    /// use boundscope::{Arena, Category, ParamKind, Plan, Registry, Symbol, Tensor, TraceBuilder};
    /// // `square(x) = x * x`, with a decomposition and its gradient `2 x g`.
    /// let square = Symbol::new("square", Category::Composite)
    ///     .params(&[ParamKind::Tensor])
    ///     .same_shape_as_first()
    ///     .decomposition(|b, args| {
    ///         let x = args[0].value().unwrap();
    ///         b.mul(x, x)
    ///     })
    ///     .vjp(|b, op| {
    ///         let x = op.value(0).unwrap();
    ///         let twice = b.mul_scalar(x, 2.0)?;
    ///         Ok(vec![Some(b.mul(twice, op.cotangent)?)])
    ///     });
    /// let mut registry = Registry::with_builtins();
    /// let square = registry.register(square).unwrap();
    /// let arena = Arena::new();
    /// let mut b = TraceBuilder::new(&arena, &registry);
    /// let x = b.input(&[3]).unwrap();
    /// let y = b.bind(square, &[x.into()]).unwrap();
    /// let loss = b.sum(y).unwrap();
    /// b.output(loss).unwrap();
    /// let grads = Grad::new(&[x]).run(&b.finish().unwrap(), &arena).unwrap();
    /// let plan = Plan::compile(&grads, &[CpuReference::shared()]).unwrap();
    /// let out = plan.run(&[&Tensor::new(&[3], vec![1.0, 2.0, 3.0]).unwrap()]).unwrap();
    /// assert_eq!(out[0].to_f32_vec(), &[14.0]);
    /// assert_eq!(out[1].to_f32_vec(), &[2.0, 4.0, 6.0]);
    /// ```
    pub fn vjp(
        mut self,
        rule: impl for<'a> Fn(&mut TraceBuilder<'a>, &VjpInput<'_, 'a>) -> Result<Vec<Option<ValueId>>>
            + Send
            + Sync
            + 'static,
    ) -> Self {
        self.vjp = Some(Arc::new(rule));
        self
    }

    /// Whether the symbol has a gradient rule of its own ([`vjp`](Self::vjp)).
    pub fn has_vjp(&self) -> bool {
        self.vjp.is_some()
    }

    /// The symbol's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The symbol's category.
    pub fn category(&self) -> Category {
        self.category
    }

    /// The symbol's parameters.
    pub fn param_kinds(&self) -> &[ParamKind] {
        &self.params
    }

    /// The built-in prim this symbol is (its id in [`prims`](crate::prims)), or `None` for a
    /// symbol of your own, whatever its name: how an executor recognises the built-ins.
    ///
    /// ```
    /// use boundscope::{prims, Category, ParamKind, Registry, Symbol};
    /// let builtins = Registry::with_builtins();
    /// assert_eq!(builtins.get(prims::RELU).unwrap().symbol.builtin_prim(), Some(prims::RELU));
    ///
    /// let mut mine = Registry::empty();
    /// let relu = Symbol::new("relu", Category::Elementwise).params(&[ParamKind::Tensor]).same_shape_as_first();
    /// let id = mine.register(relu).unwrap();
    /// // The name of a built-in does not make it one; its id comes past the built-ins'.
    /// assert_eq!(mine.get(id).unwrap().symbol.builtin_prim(), None);
    /// assert_eq!(id.index(), prims::BUILTIN_NAMES.len());
    /// ```
    pub fn builtin_prim(&self) -> Option<SymbolId> {
        self.builtin.filter(|id| id.index() <= crate::prims::LAST_PRIM.index())
    }

    /// The built-in composite this symbol is (`softmax`, `layer_norm`, `linear`, ...), or `None`
    /// for a prim or a symbol of your own: how an executor that runs a built-in composite whole
    /// recognises it.
    ///
    /// ```
    /// use boundscope::{prims, Registry};
    /// let builtins = Registry::with_builtins();
    /// assert_eq!(builtins.get(prims::LINEAR).unwrap().symbol.builtin_composite(), Some(prims::LINEAR));
    /// assert_eq!(builtins.get(prims::LINEAR).unwrap().symbol.builtin_prim(), None);
    /// ```
    pub fn builtin_composite(&self) -> Option<SymbolId> {
        self.builtin.filter(|id| id.index() > crate::prims::LAST_PRIM.index() && *id != crate::prims::REGION)
    }

    /// Whether the symbol has a decomposition.
    pub fn has_decomposition(&self) -> bool {
        self.decomposition.is_some()
    }

    /// Whether the symbol has a CPU implementation of its own (built-in prims are implemented by
    /// the CPU executor itself).
    pub fn has_cpu_kernel(&self) -> bool {
        self.cpu_kernel.is_some()
    }

    pub(crate) fn arity_text(&self) -> String {
        if self.required == self.params.len() {
            self.required.to_string()
        } else {
            format!("{} to {}", self.required, self.params.len())
        }
    }
}

impl fmt::Debug for Symbol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Symbol")
            .field("name", &self.name)
            .field("category", &self.category)
            .field("params", &self.params)
            .field("required", &self.required)
            .field("decomposition", &self.decomposition.is_some())
            .field("cpu_kernel", &self.cpu_kernel.is_some())
            .field("vjp", &self.vjp.is_some())
            .field("builtin", &self.builtin)
            .finish()
    }
}

/// A registered symbol: its id and definition.
#[derive(Clone, Copy, Debug)]
pub struct SymbolRef<'r> {
    /// Its id in the registry.
    pub id: SymbolId,
    /// Its definition.
    pub symbol: &'r Symbol,
}
