//! Traces: the ordered bound symbols of one program, with its inputs, outputs and value
//! metadata, all in a caller-owned arena; and `verify`, which checks the IR's rules.

use std::time::Duration;

use smallvec::SmallVec;

use super::bound_symbol::{Arg, BoundSymbol};
use super::ids::ValueId;
use super::meta::{TensorMeta, ValueMeta};
use super::registry::Registry;
use super::scopes::{NamedScope, ScopeTable};
use super::symbol::ArgInfo;
use crate::core::guards::GuardTable;
use crate::error::{Error, Result};

/// One pass that built a trace, with how long it took; listed in the trace's header.
#[derive(Clone, Debug, PartialEq)]
pub struct PassRecord {
    /// The pass's name.
    pub name: String,
    /// How long it ran.
    pub elapsed: Duration,
}

/// The ordered bound symbols of one program, with its inputs, outputs and value metadata.
///
/// Made by [`TraceBuilder`](crate::TraceBuilder) or by a [`Pass`](crate::passes::Pass); never
/// mutated afterwards. `Display` prints it as a readable program.
///
/// ```
/// use boundscope::{Arena, Registry, TraceBuilder};
/// let registry = Registry::with_builtins();
/// let arena = Arena::new();
/// let mut b = TraceBuilder::new(&arena, &registry);
/// let x = b.input(&[4]).unwrap();
/// let y = b.add_scalar(x, 1.0).unwrap();
/// b.output(y).unwrap();
/// let trace = b.finish().unwrap();
/// assert_eq!(trace.to_string(), "\
/// ## boundscope trace: 1 bound symbol
/// def trace(t0: f32[4]):
///   t1 = add(t0, 1.0)
///   return (t1,)
/// ");
/// trace.verify().unwrap();
/// ```
#[derive(Clone, Debug)]
pub struct Trace<'a> {
    pub(crate) registry: &'a Registry,
    pub(crate) values: &'a [ValueMeta<'a>],
    pub(crate) inputs: &'a [ValueId],
    pub(crate) outputs: &'a [ValueId],
    pub(crate) bound_symbols: &'a [BoundSymbol<'a>],
    pub(crate) history: Vec<PassRecord>,
    /// Guards attached to this trace: a side table, never in the arena.
    pub(crate) guards: GuardTable,
    /// Its named scopes: a side table too.
    pub(crate) scopes: ScopeTable,
    /// In-place updates: `(input, value)` pairs, `value` (an output) replacing `input` after
    /// each run ([`TraceBuilder::update`](crate::TraceBuilder::update)).
    pub(crate) updates: Vec<(ValueId, ValueId)>,
}

impl<'a> Trace<'a> {
    /// The registry its symbols come from.
    pub fn registry(&self) -> &'a Registry {
        self.registry
    }

    /// Its top-level bound symbols, in program order.
    pub fn bound_symbols(&self) -> &'a [BoundSymbol<'a>] {
        self.bound_symbols
    }

    /// Its named scopes ([`TraceBuilder::scope`](crate::TraceBuilder::scope)), outer before
    /// inner, in program order.
    pub fn scopes(&self) -> &[NamedScope] {
        &self.scopes.scopes
    }

    /// The path of the innermost scope holding top-level bound symbol `position`, if any.
    pub fn scope_path(&self, position: usize) -> Option<&str> {
        self.scopes.innermost(position).map(|i| self.scopes.scopes[i].path())
    }

    /// What passes did to its scopes: each one cut around a fused region that straddles it,
    /// split in pieces, or gone (a plan's notes include them).
    pub fn scope_notes(&self) -> &[String] {
        &self.scopes.notes
    }

    /// Number of top-level bound symbols.
    pub fn len(&self) -> usize {
        self.bound_symbols.len()
    }

    /// Whether it has no bound symbols.
    pub fn is_empty(&self) -> bool {
        self.bound_symbols.is_empty()
    }

    /// Its inputs, in order.
    pub fn inputs(&self) -> &'a [ValueId] {
        self.inputs
    }

    /// Its outputs, in order.
    pub fn outputs(&self) -> &'a [ValueId] {
        self.outputs
    }

    /// Number of values (including those internal to decompositions).
    pub fn value_count(&self) -> usize {
        self.values.len()
    }

    /// The metadata of a value.
    ///
    /// # Errors
    /// [`Error::UndefinedValue`] if the trace has no such value.
    pub fn value_meta(&self, value: ValueId) -> Result<TensorMeta> {
        self.meta(value)
            .map(|m| TensorMeta::new(m.dtype, m.shape))
            .ok_or(Error::UndefinedValue { value, used_by: "Trace::value_meta".into() })
    }

    pub(crate) fn meta(&self, value: ValueId) -> Option<&ValueMeta<'a>> {
        self.values.get(value.index())
    }

    /// The dtype of a value (`f32` for a value it does not have).
    pub(crate) fn dtype_of(&self, value: ValueId) -> super::DType {
        self.meta(value).map_or(super::DType::F32, |m| m.dtype)
    }

    /// Its in-place updates, in the order they were declared: `(input, value)`, the output
    /// `value` replacing the input after each run (parameters and optimizer state; see
    /// [`TraceBuilder::update`](crate::TraceBuilder::update) and
    /// [`Plan::run_updating`](crate::Plan::run_updating)).
    pub fn updates(&self) -> &[(ValueId, ValueId)] {
        &self.updates
    }

    /// The passes that built it, in order.
    pub fn history(&self) -> &[PassRecord] {
        &self.history
    }

    /// The name of a bound symbol: its own (fusion regions) or its symbol's.
    pub fn symbol_name<'b>(&self, bound_symbol: &BoundSymbol<'b>) -> &'b str
    where
        'a: 'b,
    {
        bound_symbol.name().unwrap_or_else(|| {
            self.registry.get(bound_symbol.symbol).map(|s| s.symbol.name.as_str()).unwrap_or("<unknown>")
        })
    }

    /// Checks the whole trace: every symbol is registered, every bound symbol has the right
    /// arity and argument kinds, uses only values defined before it, defines each value once,
    /// and its output metadata agrees with the symbol's shape rule; decompositions are checked
    /// the same way inside their composite; every output is defined.
    ///
    /// # Errors
    /// [`Error::MalformedTrace`] naming the first offending bound symbol and the problem.
    pub fn verify(&self) -> Result<()> {
        let mut defined = vec![false; self.values.len()];
        for &input in self.inputs {
            let slot = defined
                .get_mut(input.index())
                .ok_or_else(|| malformed(None, format!("input {input} has no metadata")))?;
            if std::mem::replace(slot, true) {
                return Err(malformed(None, format!("input {input} is listed twice")));
            }
        }
        for (position, bound_symbol) in self.bound_symbols.iter().enumerate() {
            self.verify_bound_symbol(bound_symbol, &mut defined).map_err(|detail| malformed(Some(position), detail))?;
        }
        for &output in self.outputs {
            if !defined.get(output.index()).copied().unwrap_or(false) {
                return Err(malformed(None, format!("output {output} is never defined")));
            }
        }
        for (i, &(input, value)) in self.updates.iter().enumerate() {
            super::builder::check_update(self.inputs, self.outputs, self.values, input, value)
                .map_err(|detail| malformed(None, detail))?;
            if self.updates[..i].iter().any(|&(other, _)| other == input) {
                return Err(malformed(None, format!("input {input} is updated twice")));
            }
            if self.updates[..i].iter().any(|&(_, other)| other == value) {
                return Err(malformed(None, format!("{value} updates two inputs")));
            }
        }
        Ok(())
    }

    fn verify_bound_symbol(&self, bsym: &BoundSymbol<'_>, defined: &mut [bool]) -> std::result::Result<(), String> {
        if bsym.symbol == super::prims::REGION {
            return self.verify_region(bsym, defined);
        }
        let symbol = self.registry.get(bsym.symbol).map_err(|e| e.to_string())?.symbol;
        let name = &symbol.name;
        if bsym.args.len() < symbol.required || bsym.args.len() > symbol.params.len() {
            return Err(format!("`{name}` takes {} argument(s), has {}", symbol.arity_text(), bsym.args.len()));
        }
        let mut infos: SmallVec<[ArgInfo<'_>; 4]> = SmallVec::new();
        for (i, (arg, kind)) in bsym.args.iter().zip(&symbol.params).enumerate() {
            if !kind.accepts(arg) {
                return Err(format!("argument {i} of `{name}` must be {}", kind.describe()));
            }
            infos.push(match *arg {
                Arg::Value(v) => {
                    if !defined.get(v.index()).copied().unwrap_or(false) {
                        return Err(format!("`{name}` uses {v} before it is defined"));
                    }
                    let m = self.values[v.index()];
                    ArgInfo::Tensor { dtype: m.dtype, shape: m.shape }
                }
                Arg::Scalar(s) => ArgInfo::Scalar(s),
                Arg::Dims(d) => ArgInfo::Dims(d),
                Arg::DType(d) => ArgInfo::DType(d),
            });
        }
        let rule = symbol.shape_rule.as_ref().ok_or_else(|| format!("`{name}` has no shape rule"))?;
        let expected = rule(&infos).map_err(|detail| format!("`{name}`: {detail}"))?;
        let [output] = bsym.outputs else {
            return Err(format!("`{name}` must define exactly one value, defines {}", bsym.outputs.len()));
        };
        let meta = self.meta(*output).ok_or_else(|| format!("`{name}` defines {output}, which has no metadata"))?;
        if meta.dtype != expected.dtype || meta.shape != expected.shape.as_slice() {
            return Err(format!(
                "`{name}` defines {output} as {}{:?} but its shape rule gives {expected}",
                meta.dtype, meta.shape
            ));
        }
        if !bsym.subsymbols.is_empty() {
            // Subsymbols see the enclosing scope; what they define stays inside: marked in
            // `defined` while they are checked and unmarked after (a copy of `defined` per
            // composite made checking a trace take composites x values steps). Each value a
            // subsymbol defines was unmarked before it (or it is an error).
            let mut made: SmallVec<[ValueId; 8]> = SmallVec::new();
            for sub in bsym.subsymbols {
                self.verify_bound_symbol(sub, defined).map_err(|d| format!("in the decomposition of `{name}`: {d}"))?;
                made.extend_from_slice(sub.outputs);
            }
            if !defined[output.index()] {
                return Err(format!("the decomposition of `{name}` never defines its output {output}"));
            }
            for v in made {
                defined[v.index()] = false;
            }
        }
        if std::mem::replace(&mut defined[output.index()], true) {
            return Err(format!("`{name}` defines {output}, which is already defined"));
        }
        Ok(())
    }
}

impl Trace<'_> {
    /// A region: its inputs are defined; its subsymbols, checked in an inner scope, use only
    /// its inputs and each other; each output is defined by a subsymbol and defined once.
    fn verify_region(&self, bsym: &BoundSymbol<'_>, defined: &mut [bool]) -> std::result::Result<(), String> {
        let name = self.symbol_name(bsym);
        if bsym.subsymbols.is_empty() || bsym.outputs.is_empty() {
            return Err(format!("region `{name}` has no ops or no outputs"));
        }
        let mut inner = vec![false; defined.len()];
        for arg in bsym.args {
            let Arg::Value(v) = *arg else { return Err(format!("region `{name}` takes only tensors")) };
            if !defined.get(v.index()).copied().unwrap_or(false) {
                return Err(format!("region `{name}` uses {v} before it is defined"));
            }
            inner[v.index()] = true;
        }
        for sub in bsym.subsymbols {
            self.verify_bound_symbol(sub, &mut inner).map_err(|d| format!("in region `{name}`: {d}"))?;
        }
        for &o in bsym.outputs {
            if !inner.get(o.index()).copied().unwrap_or(false) {
                return Err(format!("region `{name}` lists output {o}, which none of its ops defines"));
            }
            if std::mem::replace(&mut defined[o.index()], true) {
                return Err(format!("region `{name}` defines {o}, which is already defined"));
            }
        }
        Ok(())
    }
}

fn malformed(position: Option<usize>, detail: String) -> Error {
    Error::MalformedTrace { position, detail }
}
