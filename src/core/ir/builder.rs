//! `TraceBuilder`: the checked way to make a trace.
//!
//! Every call checks its input at once (symbol known, arity, argument kinds, values defined
//! earlier, shapes), so a trace that `finish` returns is well-formed. Composites are expanded
//! as they are bound: their decomposition is built right away and kept as subsymbols, so
//! passes and plans never need to call back into user code to see inside one.

use smallvec::SmallVec;

use super::arena::{Arena, ArenaVec, TraceSize};
use super::bound_symbol::{Arg, BoundSymbol, Extras, FusedBy};
use super::ids::{SymbolId, ValueId};
use super::meta::{DType, TensorMeta, ValueMeta};
use super::registry::Registry;
use super::scopes::{check_scope_name, ScopeTable, SCOPE_SEPARATOR};
use super::symbol::ArgInfo;
use super::trace::{PassRecord, Trace};
use crate::core::guards::GuardTable;
use crate::error::{Error, Result};

fn check_shape(shape: &[usize]) -> Result<()> {
    match super::meta::checked_numel(shape) {
        Some(_) => Ok(()),
        None => Err(Error::InvalidShape { shape: shape.to_vec(), detail: super::meta::unusable_shape_detail(shape) }),
    }
}

/// Builds a [`Trace`] in an [`Arena`], checking each bound symbol as it is added.
///
/// ```
/// use boundscope::{Arena, Error, Registry, TraceBuilder};
///
/// let registry = Registry::with_builtins();
/// let arena = Arena::new();
/// let mut b = TraceBuilder::new(&arena, &registry);
/// let x = b.input(&[64, 256]).unwrap();
/// let w = b.input(&[128, 256]).unwrap();
/// let h = b.linear(x, w, None).unwrap();
/// let y = b.gelu(h).unwrap();
/// b.output(y).unwrap();
/// // Bad input is a typed error, never a panic:
/// assert!(matches!(b.call("gelu_fast", &[y.into()]), Err(Error::UnknownSymbol { .. })));
/// let trace = b.finish().unwrap();
/// assert_eq!(trace.len(), 2);
/// ```
pub struct TraceBuilder<'a> {
    arena: &'a Arena,
    registry: &'a Registry,
    values: ArenaVec<'a, ValueMeta<'a>>,
    defined: ArenaVec<'a, bool>,
    inputs: ArenaVec<'a, ValueId>,
    outputs: ArenaVec<'a, ValueId>,
    /// Bound symbols being built: the trace's own at the bottom, then one level per composite
    /// whose decomposition is being expanded.
    levels: ArenaVec<'a, ArenaVec<'a, BoundSymbol<'a>>>,
    pending_comment: Option<&'a str>,
    history: Vec<PassRecord>,
    guards: GuardTable,
    /// The composites whose decompositions are being expanded, outermost first (one per level
    /// above the trace's own).
    expanding: ArenaVec<'a, SymbolId>,
    /// The scopes closed so far.
    scopes: ScopeTable,
    /// The scopes open now, outermost first: path and first position.
    open_scopes: Vec<(String, usize)>,
    /// For a rewrite: the bound symbols of the trace whose scopes `scopes` holds, until a pass
    /// carries them to the new positions.
    scopes_of: Option<&'a [BoundSymbol<'a>]>,
    /// In-place updates declared so far: `(input, value)`.
    updates: Vec<(ValueId, ValueId)>,
    /// Whether `finish` tells the arena the trace's size, for the next builder from `new`:
    /// only builders from `new` do, so that passes' rewrites in the same arena do not.
    remembers_size: bool,
    /// Whether something was added without the checks `bind` makes ([`push_copy`](Self::push_copy),
    /// [`set_outputs`](Self::set_outputs), a [`rewrite`](Self::rewrite)'s outputs): `finish` then
    /// verifies the whole trace, so that no trace that fails [`Trace::verify`] is ever made.
    unchecked: bool,
    /// What a decomposition tried to declare for the whole trace through a call that returns
    /// no `Result` ([`set_outputs`](Self::set_outputs)): refused, and reported by the `bind`
    /// that ran the decomposition.
    refused_in_decomposition: Option<&'static str>,
}

/// Appends a bound symbol made of these parts to `level`. Built here, from the parts, it is
/// written straight into the list: built by the caller and passed in, it would travel through
/// the stack, whose wider reads stall on its narrower writes.
#[inline(never)]
fn push_bound_symbol<'a>(
    level: &mut ArenaVec<'a, BoundSymbol<'a>>,
    symbol: SymbolId,
    args: &'a [Arg<'a>],
    outputs: &'a [ValueId],
    subsymbols: &'a [BoundSymbol<'a>],
    extras: Option<&'a Extras<'a>>,
) {
    level.push(BoundSymbol { symbol, args, outputs, subsymbols, extras });
}

/// Appends a value's metadata to `values`, written straight into the list as in
/// [`push_bound_symbol`].
#[inline(never)]
fn push_value<'a>(values: &mut ArenaVec<'a, ValueMeta<'a>>, dtype: DType, shape: &'a [usize]) {
    values.push(ValueMeta { dtype, shape });
}

/// Why `value` cannot replace `input` after each run, if it cannot: `input` must be an input,
/// `value` an output of the same dtype and shape, and not an input itself.
pub(super) fn check_update(
    inputs: &[ValueId],
    outputs: &[ValueId],
    values: &[ValueMeta<'_>],
    input: ValueId,
    value: ValueId,
) -> std::result::Result<(), String> {
    if !inputs.contains(&input) {
        return Err(format!("{input} is not an input of the trace; only inputs are updated in place"));
    }
    if inputs.contains(&value) {
        return Err(format!("{value} is an input; an update is a value the trace computes"));
    }
    if !outputs.contains(&value) {
        return Err(format!("the update of {input}, {value}, is not an output of the trace"));
    }
    let (Some(a), Some(b)) = (values.get(input.index()), values.get(value.index())) else {
        return Err(format!("{input} or {value} has no metadata"));
    };
    if a.dtype != b.dtype || a.shape != b.shape {
        return Err(format!(
            "{input} is {}{:?} but its update {value} is {}{:?}; an update has its input's dtype and shape",
            a.dtype, a.shape, b.dtype, b.shape
        ));
    }
    Ok(())
}

impl<'a> TraceBuilder<'a> {
    /// The most bound symbols (and values) a builder reserves room for when it starts
    /// ([`new`](Self::new), [`with_capacity`](Self::with_capacity)), so that a wild guess cannot
    /// exhaust memory: 2^16.
    pub const MAX_RESERVED: usize = 1 << 16;

    /// How deeply decompositions may nest composites: a composite whose decomposition binds
    /// itself (directly or through other composites) and never stops is an error at this depth,
    /// not a stack overflow. Recursion that ends within it is allowed.
    pub const MAX_DECOMPOSITION_DEPTH: usize = 64;

    /// An empty builder over symbols from `registry`, allocating in `arena`.
    ///
    /// It reserves room for as many bound symbols and values as the last trace that a builder
    /// from `new` finished in `arena` had (at least 16, at most
    /// [`MAX_RESERVED`](Self::MAX_RESERVED)), so that a trace built again in a reset arena does
    /// not grow its lists. Only the first builder after such a trace reserves it; traces that
    /// passes make in the arena do not count.
    pub fn new(arena: &'a Arena, registry: &'a Registry) -> Self {
        let last = arena.take_last_trace();
        let mut b = Self::with_room(arena, registry, last.bound_symbols.max(16), last.values.max(24));
        b.remembers_size = true;
        b
    }

    /// An empty builder with room for about `bound_symbols` top-level bound symbols (and as many
    /// values) before its lists grow. Growing copies a list within the arena, so a good guess
    /// saves time; any guess is correct. Room is reserved for at most
    /// [`MAX_RESERVED`](Self::MAX_RESERVED) bound symbols; the lists grow past it as needed.
    ///
    /// ```
    /// use boundscope::{Arena, Registry, TraceBuilder};
    /// let registry = Registry::with_builtins();
    /// let arena = Arena::new();
    /// let mut b = TraceBuilder::with_capacity(&arena, &registry, 1000);
    /// let x = b.input(&[1]).unwrap();
    /// b.output(x).unwrap();
    /// assert!(b.finish().unwrap().is_empty());
    /// ```
    pub fn with_capacity(arena: &'a Arena, registry: &'a Registry, bound_symbols: usize) -> Self {
        Self::with_room(arena, registry, bound_symbols, bound_symbols.saturating_add(8))
    }

    /// An empty builder with room for `bound_symbols` top-level bound symbols and `values`
    /// values, each at most [`MAX_RESERVED`](Self::MAX_RESERVED).
    fn with_room(arena: &'a Arena, registry: &'a Registry, bound_symbols: usize, values: usize) -> Self {
        let bump = arena.bump();
        let bound_symbols = bound_symbols.min(Self::MAX_RESERVED);
        let values = values.min(Self::MAX_RESERVED);
        let mut levels = ArenaVec::with_capacity_in(4, bump);
        levels.push(ArenaVec::with_capacity_in(bound_symbols, bump));
        Self {
            arena,
            registry,
            values: ArenaVec::with_capacity_in(values, bump),
            defined: ArenaVec::with_capacity_in(values, bump),
            inputs: ArenaVec::new_in(bump),
            outputs: ArenaVec::new_in(bump),
            levels,
            pending_comment: None,
            history: Vec::new(),
            guards: GuardTable::default(),
            expanding: ArenaVec::new_in(bump),
            scopes: ScopeTable::default(),
            open_scopes: Vec::new(),
            scopes_of: None,
            updates: Vec::new(),
            remembers_size: false,
            unchecked: false,
            refused_in_decomposition: None,
        }
    }

    /// A builder for rewriting `trace` into `arena`: same registry, values, inputs, outputs and
    /// history, and no bound symbols yet. Passes use it with [`push_copy`](Self::push_copy).
    pub fn rewrite(trace: &Trace<'a>, arena: &'a Arena) -> Self {
        let mut b = Self::with_capacity(arena, trace.registry, trace.len());
        for meta in trace.values {
            b.values.push(ValueMeta { dtype: meta.dtype, shape: arena.alloc_slice_copy(meta.shape) });
            b.defined.push(false);
        }
        for &input in trace.inputs {
            b.inputs.push(input);
            if let Some(d) = b.defined.get_mut(input.index()) {
                *d = true;
            }
        }
        b.outputs.extend_from_slice(trace.outputs);
        b.history = trace.history.clone();
        b.guards = trace.guards.without_attachments();
        b.scopes = trace.scopes.clone();
        b.scopes_of = Some(trace.bound_symbols);
        b.updates = trace.updates.clone();
        // Its outputs are not defined yet.
        b.unchecked = true;
        b
    }

    /// A builder that continues `trace`: its bound symbols, guards, scopes and in-place
    /// updates as they are, ready for more (an optimizer's step after `passes::Grad`'s
    /// backward, say). New inputs go after the trace's; its outputs stay outputs.
    ///
    /// ```
    /// use boundscope::{Arena, Registry, TraceBuilder};
    /// let (registry, arena) = (Registry::with_builtins(), Arena::new());
    /// let mut b = TraceBuilder::new(&arena, &registry);
    /// let x = b.input(&[2]).unwrap();
    /// let y = b.scope("first", |b| b.exp(x)).unwrap();
    /// b.output(y).unwrap();
    /// let trace = b.finish().unwrap();
    /// let mut more = TraceBuilder::continuing(&trace, &arena);
    /// let z = more.neg(y).unwrap();
    /// more.output(z).unwrap();
    /// let longer = more.finish().unwrap();
    /// assert_eq!((longer.len(), longer.outputs().len()), (2, 2));
    /// assert_eq!(longer.scope_path(0), Some("first"));
    /// ```
    pub fn continuing(trace: &Trace<'a>, arena: &'a Arena) -> Self {
        let mut b = Self::rewrite(trace, arena);
        for bsym in trace.bound_symbols {
            b.push_copy(bsym);
        }
        // Every bound symbol kept in place: its guards and scopes stay as they are, and the
        // trace verifies as `trace` did.
        b.guards = trace.guards.clone();
        b.scopes_of = None;
        b.unchecked = false;
        b
    }

    /// The guard table the finished trace will have (for passes that carry guards).
    pub(crate) fn guards_mut(&mut self) -> &mut GuardTable {
        &mut self.guards
    }

    /// Replaces the guard table the finished trace will have.
    pub(crate) fn set_guards(&mut self, guards: GuardTable) {
        self.guards = guards;
    }

    /// Number of top-level bound symbols pushed so far.
    pub(crate) fn len(&self) -> usize {
        self.levels.first().map_or(0, |l| l.len())
    }

    /// The registry this builder takes symbols from.
    pub fn registry(&self) -> &'a Registry {
        self.registry
    }

    /// Adds an `f32` input of this shape.
    pub fn input(&mut self, shape: &[usize]) -> Result<ValueId> {
        self.input_with(&TensorMeta::f32(shape))
    }

    /// Adds an input with this metadata.
    ///
    /// # Errors
    /// [`Error::InvalidShape`] if [`checked_numel`](crate::checked_numel) refuses the shape, or
    /// [`Error::InvalidSymbol`] inside a decomposition (inputs belong to the trace).
    pub fn input_with(&mut self, meta: &TensorMeta) -> Result<ValueId> {
        self.check_top_level("input")?;
        check_shape(&meta.shape)?;
        let v = self.new_value(meta);
        self.inputs.push(v);
        Ok(v)
    }

    /// Marks a value as an output of the trace (in call order).
    ///
    /// # Errors
    /// [`Error::UndefinedValue`] if it is not defined at the trace's top level.
    pub fn output(&mut self, value: ValueId) -> Result<()> {
        self.check_top_level("output")?;
        self.check_defined(value, "trace output")?;
        self.outputs.push(value);
        Ok(())
    }

    /// The shape of a value.
    ///
    /// # Errors
    /// [`Error::UndefinedValue`] if there is no such value.
    pub fn shape(&self, value: ValueId) -> Result<&'a [usize]> {
        self.values
            .get(value.index())
            .map(|m| m.shape)
            .ok_or(Error::UndefinedValue { value, used_by: "TraceBuilder::shape".into() })
    }

    /// The dtype of a value.
    ///
    /// # Errors
    /// [`Error::UndefinedValue`] if there is no such value.
    pub fn dtype(&self, value: ValueId) -> Result<DType> {
        self.values
            .get(value.index())
            .map(|m| m.dtype)
            .ok_or(Error::UndefinedValue { value, used_by: "TraceBuilder::dtype".into() })
    }

    /// Runs `build` inside a scope named `name`: the bound symbols it adds form a span with
    /// the path of the scopes open around it and `name` (`h`, then `h.3`, then `h.3.attn`).
    /// Scopes are metadata: they change neither the bound symbols nor what they compute. A
    /// scope that adds nothing is not recorded. The scope closes whatever `build` returns.
    ///
    /// ```
    /// use boundscope::{Arena, Error, Registry, TraceBuilder};
    /// let (registry, arena) = (Registry::with_builtins(), Arena::new());
    /// let mut b = TraceBuilder::new(&arena, &registry);
    /// let mut x = b.input(&[2, 8]).unwrap();
    /// for i in 0..2 {
    ///     x = b.scope(&format!("{i}"), |b| {
    ///         let h = b.scope("mlp", |b| b.exp(x))?;
    ///         b.scope("norm", |b| b.softmax(h))
    ///     }).unwrap();
    /// }
    /// b.output(x).unwrap();
    /// let trace = b.finish().unwrap();
    /// let paths: Vec<&str> = trace.scopes().iter().map(|s| s.path()).collect();
    /// assert_eq!(paths, ["0", "0.mlp", "0.norm", "1", "1.mlp", "1.norm"]);
    /// assert_eq!(trace.scope_path(3), Some("1.norm"));
    /// let mut other = TraceBuilder::new(&arena, &registry);
    /// let err = other.scope("h.3", |_| Ok(())).unwrap_err(); // nest `h`, then `3`
    /// assert!(matches!(err, Error::InvalidScopeName { .. }));
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidScopeName`] for a name that is empty or holds a NUL or another control
    /// character, a `.` (the path separator: nest scopes instead) or a `*`;
    /// [`Error::InvalidSymbol`] inside a decomposition; the error `build` returns;
    /// [`Error::UnbalancedScope`] where `build` closed more scopes than it opened (an
    /// `exit_scope` of this scope, or of one outside it).
    pub fn scope<T>(&mut self, name: &str, build: impl FnOnce(&mut Self) -> Result<T>) -> Result<T> {
        self.enter_scope(name)?;
        let level = self.open_scopes.len();
        let entered = self.open_scopes[level - 1].clone();
        let result = build(self);
        // An `exit_scope` too many inside `build` closed this scope (or one outside it): the
        // ops `build` added after it are outside the scope, and a later `exit_scope` would
        // close the wrong one. An error here, where the mistake is, not a scope dropped. (Also
        // where `build` then opened another in its place.)
        if self.open_scopes.len() < level || self.open_scopes[level - 1] != entered {
            result?;
            let outer = if self.open_scopes.len() + 1 < level { " and a scope outside it" } else { "" };
            return Err(Error::UnbalancedScope {
                detail: format!(
                    "an `exit_scope` inside `scope(\"{name}\", ..)` closed it{outer}; `scope` closes its own scope \
                     (and whatever `build` leaves open): inside it, call `exit_scope` only for an `enter_scope` of \
                     its own"
                ),
            });
        }
        // Closes this scope and whatever `build` left open inside it.
        let mut exited = Ok(());
        while self.open_scopes.len() >= level && exited.is_ok() {
            exited = self.exit_scope();
        }
        let value = result?;
        exited?;
        Ok(value)
    }

    /// Opens a scope named `name`, for code that cannot use a closure
    /// ([`scope`](Self::scope)); [`exit_scope`](Self::exit_scope) closes the innermost one.
    ///
    /// ```
    /// use boundscope::{Arena, Error, Registry, TraceBuilder};
    /// let (registry, arena) = (Registry::with_builtins(), Arena::new());
    /// let mut b = TraceBuilder::new(&arena, &registry);
    /// let x = b.input(&[4]).unwrap();
    /// b.enter_scope("block").unwrap();
    /// let y = b.exp(x).unwrap();
    /// b.output(y).unwrap();
    /// // Still open: finishing is an error, not a silently dropped scope.
    /// let mut unfinished = TraceBuilder::new(&arena, &registry);
    /// unfinished.enter_scope("open").unwrap();
    /// assert!(matches!(unfinished.exit_scope().and_then(|_| unfinished.exit_scope()), Err(Error::UnbalancedScope { .. })));
    /// b.exit_scope().unwrap();
    /// assert_eq!(b.finish().unwrap().scopes()[0].path(), "block");
    /// ```
    ///
    /// # Errors
    /// As for [`scope`](Self::scope).
    pub fn enter_scope(&mut self, name: &str) -> Result<()> {
        self.check_top_level("scope")?;
        check_scope_name(name)?;
        if self.open_scopes.len() >= usize::from(u16::MAX) {
            return Err(Error::UnbalancedScope {
                detail: format!("more than {} scopes open at once; close some with `exit_scope`", u16::MAX),
            });
        }
        let path = match self.open_scopes.last() {
            Some((outer, _)) => format!("{outer}{SCOPE_SEPARATOR}{name}"),
            None => name.to_string(),
        };
        let first = self.len();
        self.open_scopes.push((path, first));
        Ok(())
    }

    /// Closes the innermost open scope.
    ///
    /// # Errors
    /// [`Error::UnbalancedScope`] when no scope is open; [`Error::InvalidSymbol`] inside a
    /// decomposition.
    pub fn exit_scope(&mut self) -> Result<()> {
        self.check_top_level("scope")?;
        let (path, first) = self.open_scopes.pop().ok_or_else(|| Error::UnbalancedScope {
            detail: "`exit_scope` with no scope open; each `exit_scope` closes one `enter_scope`".into(),
        })?;
        let end = self.len();
        if end > first {
            self.scopes.push(path, first..end, self.open_scopes.len());
        }
        Ok(())
    }

    /// Carries the scopes of `from` to this builder's bound symbols, where old top-level bound
    /// symbol `i` became the new ones at `new_range(i)` (see [`ScopeTable::carried`]).
    pub(crate) fn carry_scopes(
        &mut self,
        from: &Trace<'_>,
        new_range: impl Fn(usize) -> Option<std::ops::Range<usize>>,
        pass: &str,
    ) {
        let new_len = self.len();
        let level = &self.levels[0];
        let registry = self.registry;
        let describe = |q: usize| {
            let bsym = &level[q];
            let name = bsym.name().map(str::to_string).unwrap_or_else(|| {
                registry.get(bsym.symbol()).map(|s| s.symbol.name().to_string()).unwrap_or_default()
            });
            format!("`{name}`")
        };
        let (carried, gone) = from.scopes.carried(from.len(), new_len, new_range, pass, describe);
        // The guards of a scope that disappeared are dropped, and say why.
        for (path, guards) in gone {
            let reason = format!("scope `{path}` disappeared (see `Trace::scope_notes`)");
            self.guards.record_scope_drop(&guards, &path, pass, &reason);
        }
        self.scopes = carried;
        self.scopes_of = None;
    }

    /// Sets a header comment for the next bound symbol added; listings print it above it.
    pub fn comment(&mut self, text: &str) {
        self.pending_comment = Some(self.arena.alloc_str(text));
    }

    /// Applies the symbol with this name.
    ///
    /// # Errors
    /// [`Error::UnknownSymbol`] (with a suggestion) and everything [`bind`](Self::bind) returns.
    pub fn call(&mut self, name: &str, args: &[Arg<'_>]) -> Result<ValueId> {
        let id = self.registry.lookup(name)?;
        self.bind(id, args)
    }

    /// Applies a symbol to arguments and returns the value it defines.
    ///
    /// # Errors
    /// [`Error::UnknownSymbol`], [`Error::ArityMismatch`], [`Error::ArgumentKind`],
    /// [`Error::UndefinedValue`], [`Error::ShapeMismatch`], or [`Error::InvalidSymbol`] when a
    /// user decomposition disagrees with its own shape rule or nests composites more than
    /// [`MAX_DECOMPOSITION_DEPTH`](Self::MAX_DECOMPOSITION_DEPTH) deep (a decomposition that
    /// binds its own symbol without end). On error nothing is added.
    pub fn bind(&mut self, symbol: SymbolId, args: &[Arg<'_>]) -> Result<ValueId> {
        let registry = self.registry;
        let def = registry.get(symbol)?.symbol;
        let name = &def.name;
        if symbol == super::prims::REGION {
            return Err(Error::InvalidSymbol {
                symbol: name.clone(),
                detail: "fusion regions are made by the fusion pass (`passes::FuseRegions`), not bound directly".into(),
            });
        }
        if args.len() < def.required || args.len() > def.params.len() {
            return Err(Error::ArityMismatch { symbol: name.clone(), expected: def.arity_text(), got: args.len() });
        }
        // A built-in elementwise prim of defined float tensors whose result is its first
        // argument's dtype and shape (most of a model's ops): the rule answers the same (tested),
        // and the result shares that argument's copy of its shape. Anything else, errors
        // included, takes the general path.
        if let Some((dtype, shape)) = def.builtin.and_then(|id| self.elementwise_result(id, args)) {
            let args = self.copy_args(args);
            let comment = self.pending_comment.take();
            let output = self.define(ValueMeta { dtype, shape });
            self.record(symbol, args, output, &[], comment);
            return Ok(output);
        }
        // One pass over the arguments: each one's kind and definedness, and what the shape rule
        // sees of it.
        let mut infos: SmallVec<[ArgInfo<'_>; 4]> = SmallVec::new();
        for (position, (arg, kind)) in args.iter().zip(&def.params).enumerate() {
            if !kind.accepts(arg) {
                return Err(Error::ArgumentKind {
                    symbol: name.clone(),
                    position,
                    expected: kind.describe(),
                    got: arg.kind_name(),
                });
            }
            infos.push(match *arg {
                Arg::Value(v) => {
                    self.check_defined(v, name)?;
                    let m = self.values[v.index()];
                    ArgInfo::Tensor { dtype: m.dtype, shape: m.shape }
                }
                Arg::Scalar(s) => ArgInfo::Scalar(s),
                Arg::Dims(d) => ArgInfo::Dims(d),
                Arg::DType(d) => ArgInfo::DType(d),
            });
        }
        let rule = def
            .shape_rule
            .as_ref()
            .ok_or_else(|| Error::InvalidSymbol { symbol: name.clone(), detail: "it has no shape rule".into() })?;
        let shape_error = |detail: String| Error::ShapeMismatch {
            symbol: name.clone(),
            shapes: infos.iter().filter_map(|i| i.shape()).map(<[usize]>::to_vec).collect(),
            detail,
        };
        // Read where the rule wrote it: moving it out would copy it through the stack.
        let result = rule(&infos);
        let meta = result.as_ref().map_err(|detail| shape_error(detail.clone()))?;
        // Most results have the shape of a tensor argument: they share its copy (checked when it
        // was defined).
        let result_shape: &[usize] = &meta.shape;
        let argument_shape = args
            .iter()
            .filter_map(Arg::value)
            .map(|v| self.values[v.index()].shape)
            .find(|&shape| super::meta::same_dims(shape, result_shape));
        if argument_shape.is_none() && super::meta::checked_numel(result_shape).is_none() {
            return Err(shape_error(format!(
                "the result {:?} cannot be used: {}",
                meta.shape.as_slice(),
                super::meta::unusable_shape_detail(&meta.shape)
            )));
        }

        let args = self.copy_args(args);
        // Taken before the decomposition runs, so that its subsymbols do not consume it.
        let comment = self.pending_comment.take();
        let (output, subsymbols) = match &def.decomposition {
            Some(decompose) => {
                if self.expanding.len() >= Self::MAX_DECOMPOSITION_DEPTH {
                    self.pending_comment = comment;
                    return Err(self.recursion_error(symbol, name));
                }
                let bump = self.arena.bump();
                let first_internal = self.values.len();
                self.levels.push(ArenaVec::new_in(bump));
                self.expanding.push(symbol);
                // A refusal belongs to the decomposition that made it: kept aside while this one
                // runs, and this one's taken after.
                let outer_refusal = self.refused_in_decomposition.take();
                let result = decompose(self, args);
                let refused = std::mem::replace(&mut self.refused_in_decomposition, outer_refusal);
                self.expanding.pop();
                let level = self.levels.pop().expect("pushed above");
                // Values made inside the decomposition are not visible at this level.
                for d in &mut self.defined[first_internal..] {
                    *d = false;
                }
                let result = match refused {
                    Some(what) => Err(Error::InvalidSymbol {
                        symbol: name.clone(),
                        detail: format!(
                            "its decomposition set the trace's {what}; a decomposition cannot declare a trace \
                             {what}; return its result value instead"
                        ),
                    }),
                    None => result,
                };
                let output = result.inspect_err(|_| self.pending_comment = comment)?;
                let produced = self.values.get(output.index()).filter(|_| output.index() >= first_internal);
                match produced {
                    Some(m) if m.dtype == meta.dtype && m.shape == meta.shape.as_slice() => {}
                    Some(m) => {
                        self.pending_comment = comment;
                        return Err(Error::InvalidSymbol {
                            symbol: name.clone(),
                            detail: format!(
                                "its decomposition returns {}{:?} but its shape rule gives {meta}",
                                m.dtype, m.shape
                            ),
                        });
                    }
                    None => {
                        self.pending_comment = comment;
                        return Err(Error::InvalidSymbol {
                            symbol: name.clone(),
                            detail: format!("its decomposition must return a value it defines, not {output}"),
                        });
                    }
                }
                self.defined[output.index()] = true;
                (output, level.into_bump_slice())
            }
            None => {
                let shape = argument_shape.unwrap_or_else(|| self.arena.alloc_slice_copy(&meta.shape));
                (self.define(ValueMeta { dtype: meta.dtype, shape }), &[][..])
            }
        };
        self.record(symbol, args, output, subsymbols, comment);
        Ok(output)
    }

    /// The dtype and shape of built-in prim `id` applied to `args` where its rule's answer is its
    /// first argument's ([`prims::elementwise_answer`](super::prims::elementwise_answer)), every
    /// tensor argument defined; `None` where the general path must check and decide. (The
    /// arguments' kinds are those the prim's parameters take: a tensor, then a tensor or a
    /// scalar.)
    #[inline]
    fn elementwise_result(&self, id: SymbolId, args: &[Arg<'_>]) -> Option<(DType, &'a [usize])> {
        if !super::prims::is_unary(id) && !super::prims::is_binary(id) {
            return None;
        }
        let tensor = |v: ValueId| self.is_defined(v).then(|| self.values[v.index()]);
        let info = |m: ValueMeta<'a>| ArgInfo::Tensor { dtype: m.dtype, shape: m.shape };
        let (first, dtype) = match *args {
            [Arg::Value(a)] => {
                let m = tensor(a)?;
                (m, super::prims::elementwise_answer(id, &[info(m)])?)
            }
            [Arg::Value(a), Arg::Scalar(s)] => {
                let m = tensor(a)?;
                (m, super::prims::elementwise_answer(id, &[info(m), ArgInfo::Scalar(s)])?)
            }
            [Arg::Value(a), Arg::Value(b)] => {
                let (m, n) = (tensor(a)?, tensor(b)?);
                (m, super::prims::elementwise_answer(id, &[info(m), info(n)])?)
            }
            _ => return None,
        };
        Some((dtype, first.shape))
    }

    /// Appends the bound symbol of `symbol` applied to `args` (the arena's copy), defining
    /// `output`, at the current level.
    fn record(
        &mut self,
        symbol: SymbolId,
        args: &'a [Arg<'a>],
        output: ValueId,
        subsymbols: &'a [BoundSymbol<'a>],
        comment: Option<&'a str>,
    ) {
        let outputs = std::slice::from_ref(self.arena.bump().alloc(output));
        let extras = Extras::comment(self.arena, comment);
        push_bound_symbol(self.current_level(), symbol, args, outputs, subsymbols, extras);
    }

    /// Appends a copy of a bound symbol (from this or another trace) without checking it, and
    /// marks its outputs defined. For passes: [`finish`](Self::finish) then checks the whole
    /// trace ([`Trace::verify`]).
    pub fn push_copy(&mut self, bound_symbol: &BoundSymbol<'_>) {
        self.unchecked = true;
        let copied = self.deep_copy(bound_symbol);
        for &o in copied.outputs {
            if let Some(d) = self.defined.get_mut(o.index()) {
                *d = true;
            }
        }
        self.current_level().push(copied);
    }

    /// As [`push_copy`](Self::push_copy), with `comment` in place of the bound symbol's own.
    pub(crate) fn push_copy_with_comment(&mut self, bound_symbol: &BoundSymbol<'_>, comment: Option<&str>) {
        let mut extras = bound_symbol.extras.copied().unwrap_or_default();
        extras.comment = comment;
        let no_extras = extras.comment.is_none() && extras.name.is_none() && extras.fused_by.is_none();
        self.push_copy(&BoundSymbol { extras: (!no_extras).then_some(&extras), ..*bound_symbol });
    }

    /// Appends a fusion region made by `fused_by`'s fusion: a bound symbol named `name` that
    /// applies `subsymbols` (copies of bound symbols of the trace being rewritten) to `inputs`,
    /// defining `outputs`. Unchecked, like [`push_copy`](Self::push_copy); [`Trace::verify`]
    /// checks it.
    pub(crate) fn push_region(
        &mut self,
        name: &str,
        fused_by: FusedBy,
        inputs: &[ValueId],
        outputs: &[ValueId],
        subsymbols: &[BoundSymbol<'_>],
    ) {
        let bump = self.arena.bump();
        let region = BoundSymbol {
            symbol: super::prims::REGION,
            args: bump.alloc_slice_fill_iter(inputs.iter().map(|&v| Arg::Value(v))),
            outputs: bump.alloc_slice_copy(outputs),
            subsymbols: bump.alloc_slice_fill_iter(subsymbols.iter().map(|s| self.deep_copy(s))),
            extras: Some(bump.alloc(Extras {
                comment: None,
                name: Some(bump.alloc_str(name)),
                fused_by: Some(fused_by),
            })),
        };
        self.push_copy(&region);
    }

    /// Carries the guards of `from` (the trace this builder rewrites) to the trace being
    /// built, for a pass that keeps or removes whole bound symbols: `new_position[i]` is where
    /// old bound symbol `i` went (`None`: removed). Guards of removed bound symbols are listed
    /// in [`Trace::dropped_guards`] with `reason(i)`. A pass that rewrites bound symbols in
    /// other ways should carry its guards itself, as the built-in passes do.
    ///
    /// # Errors
    /// [`Error::InvalidSymbol`] inside a decomposition;
    /// [`Error::MalformedTrace`] if `new_position` does not have one entry per bound symbol of
    /// `from`; [`Error::InvalidBoundSymbol`] for a position past what this builder holds;
    /// [`Error::OverlappingGuards`] if the map would make two guard spans overlap without one
    /// containing the other (for example `[Some(0), Some(2), Some(1), Some(3)]` under a guard
    /// spanning the first two of four bound symbols and another spanning the last two).
    ///
    /// Named scopes move the same way: a bound symbol stays in a scope if the old one it comes
    /// from was in it; a scope left empty disappears, with a note in [`Trace::scope_notes`] (and
    /// its guards in [`Trace::dropped_guards`]).
    ///
    /// ```
    /// use boundscope::guards::{Recorder, Selection};
    /// use boundscope::{Arena, Registry, TraceBuilder};
    /// let registry = Registry::with_builtins();
    /// let arena = Arena::new();
    /// let mut b = TraceBuilder::new(&arena, &registry);
    /// let x = b.input(&[4]).unwrap();
    /// let y = b.exp(x).unwrap();
    /// let z = b.neg(y).unwrap();
    /// b.output(z).unwrap();
    /// let mut trace = b.finish().unwrap();
    /// trace.attach_guard(Selection::All, Recorder::new()).unwrap();
    /// // A pass that keeps every bound symbol, in order.
    /// let mut rewritten = TraceBuilder::rewrite(&trace, &arena);
    /// for bsym in trace.bound_symbols() {
    ///     rewritten.push_copy(bsym);
    /// }
    /// rewritten.carry_guards(&trace, &[Some(0), Some(1)], "my_pass", |_| unreachable!()).unwrap();
    /// assert!(rewritten.carry_guards(&trace, &[Some(0)], "my_pass", |_| unreachable!()).is_err());
    /// assert!(rewritten.carry_guards(&trace, &[Some(0), Some(7)], "my_pass", |_| unreachable!()).is_err());
    /// assert_eq!(rewritten.finish().unwrap().guard_attachment_count(), 2);
    /// ```
    pub fn carry_guards(
        &mut self,
        from: &Trace<'_>,
        new_position: &[Option<usize>],
        pass: &str,
        reason: impl Fn(usize) -> String,
    ) -> Result<()> {
        self.check_top_level("guards")?;
        if new_position.len() != from.len() {
            return Err(Error::MalformedTrace {
                position: None,
                detail: format!(
                    "`{pass}` gave a position map of {} entries for a trace of {} bound symbols; \
                     give one entry per bound symbol (`None` for a removed one)",
                    new_position.len(),
                    from.len()
                ),
            });
        }
        let len = self.len();
        if let Some(&index) = new_position.iter().flatten().find(|&&p| p >= len) {
            return Err(Error::InvalidBoundSymbol { index, len });
        }
        let carried = from.guards.carry_through_removal(new_position, from.registry(), pass, reason);
        carried.check_spans_nest(pass)?;
        self.guards = carried;
        self.carry_scopes(from, |i| new_position[i].map(|p| p..p + 1), pass);
        // A map that reorders can also make a scope cross a guard span.
        let scopes: Vec<(usize, usize)> =
            self.scopes.scopes.iter().map(|s| (s.positions().start, s.positions().end)).collect();
        self.guards.check_spans_nest_with(&scopes, pass)
    }

    /// Declares that after each run the computed `value` replaces the input `input` (a
    /// parameter, an optimizer's state): the trace's in-place update. `value` becomes an output
    /// if it is not one. [`Plan::run_updating`](crate::Plan::run_updating) writes it back into
    /// the input's tensor; [`Plan::run_updating_on_device`](crate::Plan::run_updating_on_device)
    /// writes it over the input's device memory where the kernel computing it can, else
    /// exchanges buffers (no copy either way).
    ///
    /// ```
    /// use boundscope::executors::CpuReference;
    /// use boundscope::{Arena, Plan, Registry, Tensor, TraceBuilder};
    /// let (registry, arena) = (Registry::with_builtins(), Arena::new());
    /// let mut b = TraceBuilder::new(&arena, &registry);
    /// let counter = b.input(&[1]).unwrap();
    /// let next = b.add_scalar(counter, 1.0).unwrap();
    /// b.update(counter, next).unwrap();
    /// assert!(b.update(counter, next).is_err()); // once per input
    /// let plan = Plan::compile(&b.finish().unwrap(), &[CpuReference::shared()]).unwrap();
    /// assert!(plan.notes().iter().any(|n| n.contains("in place"))); // other runs do not write back
    /// let mut workspace = plan.workspace().unwrap();
    /// let mut state = Tensor::new(&[1], vec![0.0]).unwrap();
    /// for _ in 0..3 {
    ///     plan.run_updating(&mut workspace, &mut [&mut state]).unwrap();
    /// }
    /// assert_eq!(state.to_f32_vec(), &[3.0]);
    /// ```
    ///
    /// Only [`Plan::run_updating`](crate::Plan::run_updating) and
    /// [`Plan::run_updating_on_device`](crate::Plan::run_updating_on_device) write updates back;
    /// other runs (and graph replays, which refuse such plans) leave the inputs as they are.
    ///
    /// # Errors
    /// [`Error::InvalidUpdate`] if `input` is not an input, is updated already, or `value` is
    /// an input, updates another input already, or is of another dtype or shape;
    /// [`Error::UndefinedValue`] for an undefined value.
    pub fn update(&mut self, input: ValueId, value: ValueId) -> Result<()> {
        self.check_top_level("update")?;
        self.check_defined(value, "update")?;
        if self.updates.iter().any(|&(i, _)| i == input) {
            return Err(Error::InvalidUpdate { detail: format!("{input} is updated already; update each input once") });
        }
        if let Some(&(other, _)) = self.updates.iter().find(|&&(_, v)| v == value) {
            return Err(Error::InvalidUpdate {
                detail: format!(
                    "{value} updates {other} already; give each update a value of its own (a copy: `mul_scalar(v, 1.0)`)"
                ),
            });
        }
        let added = !self.outputs.contains(&value);
        if added {
            self.outputs.push(value);
        }
        if let Err(detail) = check_update(&self.inputs, &self.outputs, &self.values, input, value) {
            if added {
                self.outputs.pop();
            }
            return Err(Error::InvalidUpdate { detail });
        }
        self.updates.push((input, value));
        Ok(())
    }

    /// Whether `value` is an input of the trace.
    pub(crate) fn is_input(&self, value: ValueId) -> bool {
        self.inputs.contains(&value)
    }

    /// Whether `input` has an in-place update already.
    pub(crate) fn is_updated(&self, input: ValueId) -> bool {
        self.updates.iter().any(|&(i, _)| i == input)
    }

    /// Records that a pass built this trace (shown in the listing header).
    pub fn record_pass(&mut self, name: &str, elapsed: std::time::Duration) {
        self.history.push(PassRecord { name: name.to_string(), elapsed });
    }

    /// Replaces the outputs (for passes that change them), unchecked: [`finish`](Self::finish)
    /// then checks the whole trace ([`Trace::verify`]).
    ///
    /// Inside a decomposition it changes nothing, and the [`bind`](Self::bind) that ran the
    /// decomposition fails with [`Error::InvalidSymbol`].
    pub fn set_outputs(&mut self, outputs: &[ValueId]) {
        if self.levels.len() > 1 {
            self.refused_in_decomposition.get_or_insert("outputs");
            return;
        }
        self.unchecked = true;
        self.outputs.clear();
        self.outputs.extend_from_slice(outputs);
    }

    /// Finishes the trace. One built only with checked calls (`input`, `bind`, `output` and
    /// the like) is well formed by construction; one that took unchecked parts
    /// ([`push_copy`](Self::push_copy), [`set_outputs`](Self::set_outputs), a
    /// [`rewrite`](Self::rewrite)) is verified whole here ([`Trace::verify`]), so that passes
    /// and plans never meet a malformed trace.
    ///
    /// # Errors
    /// [`Error::MalformedTrace`] if no output was declared, or, where unchecked parts were
    /// added, naming the first bound symbol (or output) that does not verify.
    pub fn finish(mut self) -> Result<Trace<'a>> {
        if self.outputs.is_empty() {
            return Err(Error::MalformedTrace {
                position: None,
                detail: "the trace has no outputs; declare them with `TraceBuilder::output`".into(),
            });
        }
        if let Some((path, _)) = self.open_scopes.last() {
            return Err(Error::UnbalancedScope {
                detail: format!(
                    "scope `{path}` is still open ({} open in all); close each with `exit_scope` before `finish`",
                    self.open_scopes.len()
                ),
            });
        }
        // A rewrite that changed the bound symbols without carrying the scopes: their positions
        // mean nothing here. (Bound symbols copied one for one, in order, keep them.)
        let level = &self.levels[0];
        let same = |source: &[BoundSymbol<'_>]| {
            source.len() == level.len()
                && source.iter().zip(level.iter()).all(|(a, b)| a.symbol() == b.symbol() && a.outputs() == b.outputs())
        };
        if self.scopes_of.is_some_and(|source| !same(source)) {
            for scope in std::mem::take(&mut self.scopes.scopes) {
                let reason = format!(
                    "scope `{}` was dropped: a pass rewrote the trace without carrying its scopes \
                     (`TraceBuilder::carry_guards` carries them)",
                    scope.path()
                );
                // Its guards go with it, recorded (they were lost without a record).
                self.guards.record_scope_drop(&scope.guards, scope.path(), "a rewrite without `carry_guards`", &reason);
                self.scopes.notes.push(reason);
            }
        }
        let bound_symbols = self.levels.swap_remove(0).into_bump_slice();
        if self.remembers_size {
            self.arena.set_last_trace(TraceSize { bound_symbols: bound_symbols.len(), values: self.values.len() });
        }
        let trace = Trace {
            registry: self.registry,
            values: self.values.into_bump_slice(),
            inputs: self.inputs.into_bump_slice(),
            outputs: self.outputs.into_bump_slice(),
            bound_symbols,
            history: self.history,
            guards: self.guards,
            scopes: self.scopes,
            updates: self.updates,
        };
        if self.unchecked {
            trace.verify()?;
        }
        Ok(trace)
    }

    /// The error for binding `symbol` (named `name`) past the decomposition depth limit. When
    /// it closes a cycle, the error names the cycle's outermost composite (usually the one the
    /// caller bound) and the cycle from it; otherwise the innermost composites.
    fn recursion_error(&self, symbol: SymbolId, name: &str) -> Error {
        let name_of = |id: SymbolId| self.registry.get(id).map_or_else(|_| id.to_string(), |s| s.symbol.name.clone());
        let chain = |ids: &mut dyn Iterator<Item = SymbolId>| {
            ids.map(|id| format!("`{}`", name_of(id))).collect::<Vec<_>>().join(" -> ")
        };
        let limit = Self::MAX_DECOMPOSITION_DEPTH;
        match self.expanding.iter().rposition(|&s| s == symbol) {
            Some(start) => {
                let cycle = &self.expanding[start..];
                let outermost = self.expanding.iter().find(|s| cycle.contains(s)).copied().unwrap_or(symbol);
                let at = cycle.iter().position(|&s| s == outermost).unwrap_or(0);
                let mut path = cycle[at..].iter().chain(&cycle[..at]).chain([&outermost]).copied();
                Error::InvalidSymbol {
                    symbol: name_of(outermost),
                    detail: format!(
                        "its decomposition binds it again without end ({}), nesting composites more than {limit} \
                         deep; make the recursion stop (on a shape, say) or decompose into other symbols",
                        chain(&mut path)
                    ),
                }
            }
            None => {
                let innermost = &self.expanding[self.expanding.len().saturating_sub(3)..];
                Error::InvalidSymbol {
                    symbol: name.to_string(),
                    detail: format!(
                        "decompositions nest composites more than {limit} deep (innermost: {} -> `{name}`); \
                         flatten them",
                        chain(&mut innermost.iter().copied())
                    ),
                }
            }
        }
    }

    /// Inputs and outputs belong to the trace, not to a decomposition being expanded.
    fn check_top_level(&self, what: &str) -> Result<()> {
        if self.levels.len() > 1 {
            return Err(Error::InvalidSymbol {
                symbol: "decomposition".into(),
                detail: format!("a decomposition cannot declare a trace {what}; return its result value instead"),
            });
        }
        Ok(())
    }

    fn current_level(&mut self) -> &mut ArenaVec<'a, BoundSymbol<'a>> {
        self.levels.last_mut().expect("the trace level is never popped")
    }

    fn new_value(&mut self, meta: &TensorMeta) -> ValueId {
        let shape = self.arena.alloc_slice_copy(&meta.shape);
        self.define(ValueMeta { dtype: meta.dtype, shape })
    }

    /// A new value, defined from here on.
    #[inline]
    fn define(&mut self, meta: ValueMeta<'a>) -> ValueId {
        let id = ValueId::from_index(self.values.len());
        push_value(&mut self.values, meta.dtype, meta.shape);
        self.defined.push(true);
        id
    }

    /// Whether `value` is defined and visible at this level.
    fn is_defined(&self, value: ValueId) -> bool {
        self.defined.get(value.index()).copied().unwrap_or(false)
    }

    fn check_defined(&self, value: ValueId, used_by: &str) -> Result<()> {
        if self.is_defined(value) {
            Ok(())
        } else {
            Err(Error::UndefinedValue { value, used_by: used_by.to_string() })
        }
    }

    fn copy_args(&self, args: &[Arg<'_>]) -> &'a [Arg<'a>] {
        let bump = self.arena.bump();
        let copy = |arg: &Arg<'_>| match *arg {
            Arg::Value(v) => Arg::Value(v),
            Arg::Scalar(s) => Arg::Scalar(s),
            Arg::Dims(d) => Arg::Dims(bump.alloc_slice_copy(d)),
            Arg::DType(d) => Arg::DType(d),
        };
        // Most ops take one to three arguments: arrays of a size known here allocate with the
        // least work.
        match args {
            [a] => bump.alloc([copy(a)]),
            [a, b] => bump.alloc([copy(a), copy(b)]),
            [a, b, c] => bump.alloc([copy(a), copy(b), copy(c)]),
            _ => bump.alloc_slice_fill_iter(args.iter().map(copy)),
        }
    }

    fn deep_copy(&self, bsym: &BoundSymbol<'_>) -> BoundSymbol<'a> {
        let bump = self.arena.bump();
        BoundSymbol {
            symbol: bsym.symbol,
            args: self.copy_args(bsym.args),
            outputs: bump.alloc_slice_copy(bsym.outputs),
            subsymbols: bump.alloc_slice_fill_iter(bsym.subsymbols.iter().map(|s| self.deep_copy(s))),
            extras: bsym.extras.map(|e| {
                &*bump.alloc(Extras {
                    comment: e.comment.map(|c| bump.alloc_str(c) as &str),
                    name: e.name.map(|n| bump.alloc_str(n) as &str),
                    fused_by: e.fused_by,
                })
            }),
        }
    }
}

super::arena::assert_no_drop!(BoundSymbol<'static>, Extras<'static>, Arg<'static>, ValueMeta<'static>, ValueId);

#[cfg(test)]
mod tests {
    use super::*;

    fn setup() -> (Arena, Registry) {
        (Arena::new(), Registry::with_builtins())
    }

    use crate::core::passes::{FuseRegions, Pass};
    use crate::executors::CpuFusion;

    /// Built-in unary and binary prims bound through `bind`'s shortcut give what the general
    /// path gives with the same rules (a registry whose copies of those symbols lost the
    /// built-in mark): the same result's dtype and shape, or the same error, over dtypes
    /// (integers among them), shapes (broadcasts, scalars), scalar arguments in either place
    /// and undefined values.
    #[test]
    fn the_elementwise_shortcut_binds_as_the_general_path() {
        use super::super::prims::{builtin_symbols, prim_rule, BINARY, UNARY};
        let builtin = Registry::with_builtins();
        let mut general = Registry::empty();
        for (i, symbol) in builtin_symbols().into_iter().enumerate() {
            let id = SymbolId::from_index(i);
            // A symbol of one's own takes an id past the built-ins': the copy that loses its mark
            // is registered with it, at the built-in's id, and loses it after.
            let unmark = UNARY.contains(&id) || BINARY.contains(&id);
            let symbol = match prim_rule(id) {
                Some((_, rule)) if unmark => {
                    let mut symbol = symbol.shape_rule(rule);
                    symbol.builtin = Some(id);
                    symbol
                }
                _ => symbol,
            };
            assert_eq!(general.register(symbol).unwrap(), id);
            if unmark {
                general.unmark_builtin(id);
            }
            assert_eq!(
                general.get(id).unwrap().symbol.builtin.is_some(),
                builtin.get(id).unwrap().symbol.builtin.is_some() && !UNARY.contains(&id) && !BINARY.contains(&id)
            );
        }
        let arena = Arena::new();
        let (mut fast, mut slow) = (TraceBuilder::new(&arena, &builtin), TraceBuilder::new(&arena, &general));
        let mut values = Vec::new();
        for dtype in [DType::F32, DType::BF16, DType::I32] {
            for shape in [&[2, 3][..], &[3], &[2, 1], &[]] {
                let meta = TensorMeta::new(dtype, shape);
                values.push(fast.input_with(&meta).unwrap());
                assert_eq!(slow.input_with(&meta).unwrap(), *values.last().unwrap());
            }
        }
        let undefined = ValueId::from_index(999);
        let operands: Vec<Arg<'_>> =
            values.iter().chain([&undefined]).map(|&v| Arg::Value(v)).chain([Arg::Scalar(2.0)]).collect();
        let mut cases = 0;
        for id in UNARY.iter().chain(&BINARY) {
            let lists: Vec<Vec<Arg<'_>>> = if UNARY.contains(id) {
                operands.iter().map(|&a| vec![a]).collect()
            } else {
                operands.iter().flat_map(|&a| operands.iter().map(move |&b| vec![a, b])).collect()
            };
            for args in lists {
                match (fast.bind(*id, &args), slow.bind(*id, &args)) {
                    (Ok(a), Ok(b)) => {
                        assert_eq!(a, b);
                        assert_eq!(fast.values[a.index()].dtype, slow.values[b.index()].dtype, "{id:?} {args:?}");
                        assert_eq!(fast.values[a.index()].shape, slow.values[b.index()].shape, "{id:?} {args:?}");
                    }
                    (Err(a), Err(b)) => assert_eq!(format!("{a:?}"), format!("{b:?}"), "{id:?} {args:?}"),
                    (a, b) => panic!("{id:?} {args:?}: {a:?} against {b:?}"),
                }
                cases += 1;
            }
        }
        assert_eq!(cases, UNARY.len() * 14 + BINARY.len() * 14 * 14);
        // The traces they record are the same too: a comment on an op the shortcut binds, and
        // the ops a composite's decomposition binds at its own level.
        let listing = |registry: &Registry| {
            let mut b = TraceBuilder::new(&arena, registry);
            let x = b.input(&[2, 3]).unwrap();
            b.comment("scaled");
            let y = b.mul_scalar(x, 2.0).unwrap();
            let z = b.softmax(y).unwrap();
            let w = b.add(z, x).unwrap();
            b.output(w).unwrap();
            let trace = b.finish().unwrap();
            let inside: Vec<usize> = trace.bound_symbols().iter().map(|s| s.subsymbols().len()).collect();
            (trace.to_string(), inside)
        };
        let (listed, inside) = listing(&builtin);
        assert!(listed.contains("scaled") && inside.iter().any(|&n| n > 0), "{listed}");
        assert_eq!((listed, inside), listing(&general));
    }

    /// The shortcut binds without the rule: with every unary and binary prim's rule replaced
    /// by one that panics (the built-in mark kept, as only this test can), the ops it takes
    /// bind, and one it declines (an integer tensor) reaches the rule.
    #[test]
    fn the_elementwise_shortcut_does_not_call_the_rule() {
        use super::super::prims::{builtin_symbols, BINARY, UNARY};
        let mut registry = Registry::empty();
        for (i, symbol) in builtin_symbols().into_iter().enumerate() {
            let id = SymbolId::from_index(i);
            let symbol = if UNARY.contains(&id) || BINARY.contains(&id) {
                let mut replaced = symbol.shape_rule(|_| panic!("the rule was called"));
                replaced.builtin = Some(id);
                replaced
            } else {
                symbol
            };
            registry.register(symbol).unwrap();
        }
        let arena = Arena::new();
        let mut b = TraceBuilder::new(&arena, &registry);
        let x = b.input_with(&TensorMeta::new(DType::BF16, &[2, 3])).unwrap();
        let y = b.exp(x).unwrap();
        let y = b.mul(y, x).unwrap();
        let y = b.add_scalar(y, 1.0).unwrap();
        assert_eq!(b.values[y.index()].shape, &[2, 3]);
        let ids = b.input_with(&TensorMeta::new(DType::I32, &[2])).unwrap();
        let declined = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| b.exp(ids)));
        assert!(declined.is_err(), "an integer tensor goes to the rule");
    }

    /// A chain of `n` elementwise ops on one `[4]` input.
    fn chain<'a>(b: &mut TraceBuilder<'a>, n: usize) -> Result<ValueId> {
        let x = b.input(&[4])?;
        let mut v = x;
        for i in 0..n {
            v = if i % 2 == 0 { b.mul(v, x)? } else { b.exp(v)? };
        }
        b.output(v)?;
        Ok(v)
    }

    #[test]
    fn a_trace_built_again_in_a_reset_arena_reserves_its_lists_once() {
        let registry = Registry::with_builtins();
        let mut arena = Arena::with_capacity(1 << 20);
        let room = |b: &TraceBuilder<'_>| (b.levels[0].capacity(), b.values.capacity());
        let mut used = Vec::new();
        for round in 0..3 {
            let before = arena.bump().chunk_capacity();
            let mut b = TraceBuilder::new(&arena, &registry);
            // The first builder starts small; the next ones with the last trace's size: 1,000
            // bound symbols and 1,001 values (the input, then one per op).
            assert_eq!(room(&b), if round == 0 { (16, 24) } else { (1000, 1001) });
            chain(&mut b, 1000).unwrap();
            let trace = b.finish().unwrap();
            used.push(before - arena.bump().chunk_capacity());
            // A pass in the same arena (fusion, to a few regions) does not change the size the
            // next round's builder reserves.
            let fused = FuseRegions::new(CpuFusion::shared()).run(&trace, &arena).unwrap();
            assert!(fused.len() < 100, "{}", fused.len());
            arena.reset();
        }
        // The first build grew its lists (copying them, leaving the old copies behind).
        assert!(used[1] < used[0] * 3 / 5, "{used:?}");
        assert_eq!(used[1], used[2]);
        // Only the first builder after a finished trace takes its size.
        let first = TraceBuilder::new(&arena, &registry);
        assert_eq!(room(&first), (1000, 1001));
        let mut second = TraceBuilder::new(&arena, &registry);
        assert_eq!(room(&second), (16, 24));
        // Growing past the reservation is still correct.
        chain(&mut second, 3000).unwrap();
        assert_eq!(second.finish().unwrap().len(), 3000);
    }

    #[test]
    fn a_result_of_an_arguments_shape_shares_its_copy() {
        let (arena, registry) = setup();
        let mut b = TraceBuilder::new(&arena, &registry);
        let x = b.input(&[2, 3]).unwrap();
        let row = b.input(&[3]).unwrap();
        let y = b.mul(x, row).unwrap(); // broadcast: [2, 3], x's shape
        let s = b.sum(y).unwrap(); // [2, 1]: a shape of its own
        b.output(s).unwrap();
        let trace = b.finish().unwrap();
        let shape = |v: ValueId| trace.values[v.index()].shape;
        assert!(std::ptr::eq(shape(x), shape(y)));
        assert_eq!(shape(s), &[2, 1]);
    }

    #[test]
    fn rejects_bad_input_with_the_right_error() {
        let (arena, registry) = setup();
        let mut b = TraceBuilder::new(&arena, &registry);
        let x = b.input(&[2, 3]).unwrap();
        let ghost = ValueId::from_index(99);
        assert!(matches!(b.exp(ghost), Err(Error::UndefinedValue { .. })));
        assert!(matches!(b.bind(crate::prims::ADD, &[x.into()]), Err(Error::ArityMismatch { .. })));
        assert!(matches!(b.bind(crate::prims::EXP, &[Arg::Scalar(1.0)]), Err(Error::ArgumentKind { .. })));
        let err = b.matmul(x, x).unwrap_err();
        assert!(matches!(&err, Error::ShapeMismatch { symbol, shapes, .. } if symbol == "matmul" && shapes.len() == 2));
        assert!(matches!(b.bind(SymbolId::from_index(500), &[]), Err(Error::UnknownSymbol { .. })));
        assert!(matches!(b.output(ghost), Err(Error::UndefinedValue { .. })));
        // Shapes whose element count overflows are typed errors, not panics.
        assert!(matches!(b.input(&[usize::MAX, 2]), Err(Error::InvalidShape { .. })));
        let empty = b.input(&[0]).unwrap();
        assert!(matches!(b.reshape(empty, &[usize::MAX, 2]), Err(Error::ShapeMismatch { .. })));
        assert!(matches!(b.broadcast_to(x, &[1 << 62, 2, 3]), Err(Error::ShapeMismatch { .. })));
        assert!(matches!(crate::Tensor::new(&[1 << 63, 2], vec![]), Err(Error::InvalidTensor { .. })));
        // Nothing was added by the failed calls.
        let y = b.exp(x).unwrap();
        b.output(y).unwrap();
        assert_eq!(b.finish().unwrap().len(), 1);
    }

    #[test]
    fn zero_sized_shapes_follow_one_rule_whatever_the_order_of_dimensions() {
        let (arena, registry) = setup();
        let mut b = TraceBuilder::new(&arena, &registry);
        // No elements, but strides that overflow: refused in every order, with a message that
        // does not claim it has too many elements.
        for shape in [[0, usize::MAX, 2], [2, usize::MAX, 0], [usize::MAX, 0, 2]] {
            let err = b.input(&shape).unwrap_err();
            assert!(matches!(err, Error::InvalidShape { .. }), "{shape:?}: {err}");
            assert!(err.to_string().contains("no elements"), "{err}");
            let err = crate::Tensor::new(&shape, vec![]).unwrap_err();
            assert!(err.to_string().contains("no elements"), "{err}");
        }
        // A usable zero-sized shape with large dimensions transposes and broadcasts: its strides
        // fit.
        let x = b.input(&[0, 1 << 30, 4]).unwrap();
        let t = b.transpose(x, &[2, 0, 1]).unwrap();
        let y = b.broadcast_to(x, &[1 << 20, 0, 1 << 30, 4]).unwrap();
        let e = b.exp(y).unwrap();
        b.output(t).unwrap();
        b.output(e).unwrap();
        let trace = b.finish().unwrap();
        let plan = crate::Plan::compile(&trace, &[crate::executors::CpuReference::shared()]).unwrap();
        let out = plan.run(&[&crate::Tensor::new(&[0, 1 << 30, 4], vec![]).unwrap()]).unwrap();
        assert_eq!(out[0].shape(), &[4, 0, 1 << 30]);
        assert_eq!(out[1].shape(), &[1 << 20, 0, 1 << 30, 4]);
    }

    #[test]
    fn any_capacity_guess_is_correct() {
        let (arena, registry) = setup();
        for guess in [0, 1 << 40, usize::MAX - 4, usize::MAX] {
            let mut b = TraceBuilder::with_capacity(&arena, &registry, guess);
            let x = b.input(&[1]).unwrap();
            let y = b.exp(x).unwrap();
            b.output(y).unwrap();
            assert_eq!(b.finish().unwrap().len(), 1, "guess {guess}");
        }
    }

    /// A composite `name` whose decomposition applies `exp`, then `next` on the result: a
    /// recursion without end when `next` leads back to `name`.
    fn endless(name: &str, next: &'static str) -> crate::Symbol {
        crate::Symbol::new(name, crate::Category::Composite)
            .params(&[crate::ParamKind::Tensor])
            .same_shape_as_first()
            .decomposition(move |b, args| {
                let Arg::Value(x) = args[0] else { unreachable!("a tensor") };
                let y = b.exp(x)?;
                b.call(next, &[y.into()])
            })
    }

    /// A composite that applies `exp` and, while the first dimension is above 1, binds itself
    /// on the tensor reshaped to half as many rows: a recursion that ends.
    fn halve() -> crate::Symbol {
        crate::Symbol::new("halve", crate::Category::Composite)
            .params(&[crate::ParamKind::Tensor])
            .same_shape_as_first()
            .decomposition(|b, args| {
                let Arg::Value(x) = args[0] else { unreachable!("a tensor") };
                let shape = b.shape(x)?.to_vec();
                let y = b.exp(x)?;
                if shape[0] <= 1 {
                    return Ok(y);
                }
                let halved = b.reshape(y, &[shape[0] / 2, 2 * shape[1]])?;
                let inner = b.call("halve", &[halved.into()])?;
                let back = b.reshape(inner, &shape)?;
                b.exp(back)
            })
    }

    /// A decomposition that declares something of the whole trace (an input, an output, the
    /// outputs, guards) fails its `bind`, and leaves the trace as it was.
    #[test]
    fn a_decomposition_cannot_declare_what_belongs_to_the_trace() {
        use crate::core::ir::{Category, ParamKind, Symbol};
        type Misuse = fn(&mut TraceBuilder<'_>, ValueId) -> Result<()>;
        let misuses: [(&str, Misuse); 4] = [
            ("input", |b, _| b.input(&[1]).map(|_| ())),
            ("output", |b, x| b.output(x)),
            ("outputs", |b, x| {
                b.set_outputs(&[x]);
                Ok(())
            }),
            ("guards", |b, _| {
                let arena = Box::leak(Box::new(Arena::new()));
                let registry = Box::leak(Box::new(Registry::with_builtins()));
                let mut other = TraceBuilder::new(arena, registry);
                let y = other.input(&[1])?;
                other.output(y)?;
                b.carry_guards(&other.finish()?, &[], "mine", |_| String::new())
            }),
        ];
        for (what, misuse) in misuses {
            let mut registry = Registry::with_builtins();
            let symbol = Symbol::new("sneaky", Category::Composite)
                .params(&[ParamKind::Tensor])
                .same_shape_as_first()
                .decomposition(move |b, a| {
                    let x = a[0].value().unwrap();
                    misuse(b, x)?;
                    b.neg(x)
                });
            let sneaky = registry.register(symbol).unwrap();
            let arena = Arena::new();
            let mut b = TraceBuilder::new(&arena, &registry);
            let x = b.input(&[3]).unwrap();
            let y = b.exp(x).unwrap();
            b.output(y).unwrap();
            let err = b.bind(sneaky, &[x.into()]).unwrap_err();
            assert!(matches!(err, Error::InvalidSymbol { .. }), "{what}: {err}");
            assert!(err.to_string().contains(&format!("cannot declare a trace {what}")), "{what}: {err}");
            let trace = b.finish().unwrap();
            assert_eq!((trace.len(), trace.outputs(), trace.inputs().len()), (1, &[y][..], 1), "{what}");
        }
    }

    /// The refusal of `set_outputs` is reported by the `bind` whose decomposition called it,
    /// not by a composite that decomposition binds after (which took it before).
    #[test]
    fn a_refused_set_outputs_fails_the_bind_that_ran_it() {
        use crate::core::ir::{Category, ParamKind, Symbol};
        let mut registry = Registry::with_builtins();
        let symbol = Symbol::new("sneaky", Category::Composite)
            .params(&[ParamKind::Tensor])
            .same_shape_as_first()
            .decomposition(|b, a| {
                let x = a[0].value().unwrap();
                b.set_outputs(&[x]);
                // A composite bound after, whose error the decomposition would swallow.
                b.gelu(x).or_else(|_| b.tanh(x))
            });
        let sneaky = registry.register(symbol).unwrap();
        let arena = Arena::new();
        let mut b = TraceBuilder::new(&arena, &registry);
        let x = b.input(&[3]).unwrap();
        let err = b.bind(sneaky, &[x.into()]).unwrap_err();
        assert!(matches!(&err, Error::InvalidSymbol { symbol, .. } if symbol == "sneaky"), "{err}");
    }

    #[test]
    fn a_decomposition_that_binds_itself_without_end_is_an_error() {
        let mut registry = Registry::with_builtins();
        registry.register(endless("spin", "spin")).unwrap();
        registry.register(endless("ping", "pong")).unwrap();
        registry.register(endless("pong", "ping")).unwrap();
        registry.register(halve()).unwrap();
        let arena = Arena::new();
        let mut b = TraceBuilder::new(&arena, &registry);
        let x = b.input(&[1, 4]).unwrap();
        for (name, cycle) in [
            ("spin", "`spin` -> `spin`"),
            ("ping", "`ping` -> `pong` -> `ping`"),
            ("pong", "`pong` -> `ping` -> `pong`"),
        ] {
            let err = b.call(name, &[x.into()]).unwrap_err();
            assert!(matches!(&err, Error::InvalidSymbol { symbol, .. } if symbol == name), "{err}");
            assert!(err.to_string().contains(cycle), "{err}");
        }
        // Recursion that ends is fine (20 levels here).
        let big = b.input(&[1 << 20, 1]).unwrap();
        let y = b.call("halve", &[big.into()]).unwrap();
        b.output(y).unwrap();
        let trace = b.finish().unwrap();
        trace.verify().unwrap();
        assert_eq!(trace.len(), 1);
    }

    #[test]
    fn composite_internals_are_not_visible_outside() {
        let (arena, registry) = setup();
        let mut b = TraceBuilder::new(&arena, &registry);
        let x = b.input(&[2, 3]).unwrap();
        let y = b.softmax(x).unwrap();
        // t1 is the `max` inside softmax's decomposition.
        let internal = ValueId::from_index(1);
        assert_ne!(internal, y);
        assert!(matches!(b.exp(internal), Err(Error::UndefinedValue { .. })));
        b.output(y).unwrap();
        let trace = b.finish().unwrap();
        trace.verify().unwrap();
    }

    #[test]
    fn finish_without_outputs_is_an_error() {
        let (arena, registry) = setup();
        let mut b = TraceBuilder::new(&arena, &registry);
        b.input(&[1]).unwrap();
        assert!(matches!(b.finish(), Err(Error::MalformedTrace { .. })));
    }

    /// `finish` verifies a trace that took unchecked parts, so no malformed trace reaches a
    /// pass or a plan (an output never defined panicked in `FuseRegions` and `Grad` before).
    #[test]
    fn finish_verifies_what_push_copy_and_set_outputs_let_through() {
        let (arena, registry) = setup();
        let mut good = TraceBuilder::new(&arena, &registry);
        let x = good.input(&[2]).unwrap();
        let y = good.exp(x).unwrap();
        let z = good.neg(y).unwrap();
        good.output(z).unwrap();
        let trace = good.finish().unwrap();
        // Reverse the order: `neg` now uses `y` before `exp` defines it.
        let mut bad = TraceBuilder::rewrite(&trace, &arena);
        bad.push_copy(&trace.bound_symbols()[1]);
        bad.push_copy(&trace.bound_symbols()[0]);
        let err = bad.finish().unwrap_err();
        assert!(matches!(err, Error::MalformedTrace { position: Some(0), .. }), "{err}");
        // An output never defined.
        let mut b = TraceBuilder::new(&arena, &registry);
        let x = b.input(&[4]).unwrap();
        let y = b.exp(x).unwrap();
        b.output(y).unwrap();
        b.set_outputs(&[y, ValueId::from_index(99)]);
        let err = b.finish().unwrap_err();
        assert!(matches!(&err, Error::MalformedTrace { position: None, detail } if detail.contains("t99")), "{err}");
        // A rewrite that copies nothing leaves its outputs undefined.
        let err = TraceBuilder::rewrite(&trace, &arena).finish().unwrap_err();
        assert!(matches!(err, Error::MalformedTrace { position: None, .. }), "{err}");
        // One that copies every bound symbol in order, or continues the trace, is the trace.
        let mut copy = TraceBuilder::rewrite(&trace, &arena);
        trace.bound_symbols().iter().for_each(|bsym| copy.push_copy(bsym));
        assert_eq!(copy.finish().unwrap().to_string(), trace.to_string());
        assert_eq!(TraceBuilder::continuing(&trace, &arena).finish().unwrap().to_string(), trace.to_string());
    }
}
