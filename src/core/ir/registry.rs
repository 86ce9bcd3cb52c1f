//! The open registry of symbols: built-ins first, then the user's own, each with a stable id.

use std::collections::HashMap;

use super::ids::SymbolId;
use super::prims;
use super::symbol::{Category, Symbol, SymbolRef};
use crate::error::{did_you_mean, Error, Result};

/// All symbols a trace may use. Built-in symbols have the fixed ids in [`prims`]; symbols
/// of your own get the ids past them, in order, even in a registry made
/// [`empty`](Self::empty): an id of [`prims`] never names another symbol, so the typed builder
/// methods ([`TraceBuilder::add`](crate::TraceBuilder::add) and the rest) and the built-in
/// decompositions, which bind those ids, fail with [`Error::UnknownSymbol`] in a registry
/// without the built-in rather than bind a symbol of yours.
///
/// ```
/// use boundscope::{prims, Arena, Category, Error, ParamKind, Registry, Symbol, TraceBuilder};
/// let mut mine = Registry::empty();
/// let square = Symbol::new("square", Category::Elementwise).params(&[ParamKind::Tensor]).same_shape_as_first();
/// let id = mine.register(square)?;
/// assert_eq!(id.index(), prims::BUILTIN_NAMES.len());
/// let arena = Arena::new();
/// let mut b = TraceBuilder::new(&arena, &mine);
/// let x = b.input(&[3])?;
/// let err = b.neg(x).unwrap_err();
/// assert!(matches!(&err, Error::UnknownSymbol { name, .. } if name == "neg"));
/// assert!(err.to_string().contains("Registry::with_builtins"), "{err}");
/// # Ok::<(), boundscope::Error>(())
/// ```
///
/// ```
/// use boundscope::{prims, Registry};
/// let registry = Registry::with_builtins();
/// assert_eq!(registry.lookup("add").unwrap(), prims::ADD);
/// let err = registry.lookup("sigmod").unwrap_err();
/// assert!(err.to_string().contains("did you mean `sigmoid`?"));
/// ```
#[derive(Debug)]
pub struct Registry {
    /// By id; `None` for a built-in's id in a registry without it.
    symbols: Vec<Option<Symbol>>,
    /// Registered symbols (the `Some`s of `symbols`).
    len: usize,
    by_name: HashMap<String, SymbolId>,
    /// Unique to this registry in this state, process-wide: a new registry, a clone and every
    /// `register` get a fresh one, so that what was compiled for one set of symbols is never
    /// taken for another's (the front end's plan cache keys on it).
    generation: u64,
}

/// The next registry generation (never reused in a process).
fn next_generation() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

impl Default for Registry {
    fn default() -> Self {
        Self { symbols: Vec::new(), len: 0, by_name: HashMap::new(), generation: next_generation() }
    }
}

impl Clone for Registry {
    fn clone(&self) -> Self {
        Self {
            symbols: self.symbols.clone(),
            len: self.len,
            by_name: self.by_name.clone(),
            generation: next_generation(),
        }
    }
}

impl Registry {
    /// Unique to this registry and its current symbols, process-wide.
    pub(crate) fn generation(&self) -> u64 {
        self.generation
    }

    /// A registry with no symbols at all.
    pub fn empty() -> Self {
        Self::default()
    }

    /// A registry holding the built-in prims and composites (see [`prims`]).
    pub fn with_builtins() -> Self {
        let mut registry = Self::empty();
        for symbol in prims::builtin_symbols() {
            registry.register(symbol).expect("built-in symbols are valid and distinct");
        }
        registry
    }

    /// Adds a symbol and returns its id: a built-in's own id for a copy of a built-in (see
    /// [`Symbol`]), else the next id past the built-ins' and the symbols registered before.
    ///
    /// # Errors
    /// [`Error::DuplicateSymbol`] if the name is taken; [`Error::InvalidSymbol`] if it has no
    /// shape rule, an empty name, or is a composite without a decomposition.
    pub fn register(&mut self, symbol: Symbol) -> Result<SymbolId> {
        let invalid = |detail: &str| Error::InvalidSymbol { symbol: symbol.name.clone(), detail: detail.into() };
        if symbol.name.is_empty() || !symbol.name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(invalid("a name must be non-empty ASCII letters, digits and `_`"));
        }
        if symbol.shape_rule.is_none() {
            return Err(invalid("it has no shape rule; call `.shape_rule(..)` or `.same_shape_as_first()`"));
        }
        if symbol.category == Category::Composite && symbol.decomposition.is_none() {
            return Err(invalid("a composite needs a decomposition; call `.decomposition(..)`"));
        }
        if self.by_name.contains_key(&symbol.name) {
            return Err(Error::DuplicateSymbol { name: symbol.name });
        }
        // A built-in's id is free here: only a copy of that built-in takes it, and names are
        // distinct.
        let index = match symbol.builtin {
            Some(id) => id.index(),
            None => self.symbols.len().max(prims::BUILTIN_NAMES.len()),
        };
        if self.symbols.len() <= index {
            self.symbols.resize_with(index + 1, || None);
        }
        self.generation = next_generation();
        let id = SymbolId::from_index(index);
        self.by_name.insert(symbol.name.clone(), id);
        self.symbols[index] = Some(symbol);
        self.len += 1;
        Ok(id)
    }

    /// Clears the built-in mark of the symbol at `id` (for tests of the paths taken by symbols
    /// that are not built-ins, at a built-in's id).
    #[cfg(test)]
    pub(crate) fn unmark_builtin(&mut self, id: SymbolId) {
        if let Some(Some(symbol)) = self.symbols.get_mut(id.index()) {
            symbol.builtin = None;
        }
    }

    /// The symbol with this id.
    ///
    /// # Errors
    /// [`Error::UnknownSymbol`] if no symbol has this id.
    pub fn get(&self, id: SymbolId) -> Result<SymbolRef<'_>> {
        match self.symbols.get(id.index()) {
            Some(Some(symbol)) => Ok(SymbolRef { id, symbol }),
            // A built-in's id: named, so that the error says where built-ins come from.
            _ => Err(Error::UnknownSymbol {
                name: prims::BUILTIN_NAMES.get(id.index()).map_or_else(|| id.to_string(), |name| name.to_string()),
                suggestion: None,
            }),
        }
    }

    /// The id of the symbol with this name.
    ///
    /// # Errors
    /// [`Error::UnknownSymbol`], with the closest name when one is close.
    pub fn lookup(&self, name: &str) -> Result<SymbolId> {
        self.by_name.get(name).copied().ok_or_else(|| Error::UnknownSymbol {
            name: name.to_string(),
            suggestion: did_you_mean(name, self.names()),
        })
    }

    /// Every registered name, in id order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.symbols.iter().flatten().map(|s| s.name.as_str())
    }

    /// Every registered symbol, in id order.
    pub fn iter(&self) -> impl Iterator<Item = SymbolRef<'_>> {
        let symbols = self.symbols.iter().enumerate();
        symbols.filter_map(|(i, symbol)| Some(SymbolRef { id: SymbolId::from_index(i), symbol: symbol.as_ref()? }))
    }

    /// Number of registered symbols.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no symbol is registered.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::ir::ParamKind;

    #[test]
    fn builtin_ids_match_constants() {
        let r = Registry::with_builtins();
        for (id, name) in prims::BUILTIN_NAMES.iter().enumerate() {
            assert_eq!(r.lookup(name).unwrap().index(), id, "{name}");
        }
        assert_eq!(r.len(), prims::BUILTIN_NAMES.len());
    }

    /// Ids of [`prims`] never name a user's symbol: an empty registry numbers its symbols past
    /// them, and a copy of a built-in takes its own id.
    #[test]
    fn a_users_symbols_never_take_a_builtin_id() {
        let builtins = Registry::with_builtins();
        let mut r = Registry::empty();
        let square = Symbol::new("square", Category::Elementwise).params(&[ParamKind::Tensor]).same_shape_as_first();
        let square = r.register(square).unwrap();
        assert_eq!(square.index(), prims::BUILTIN_NAMES.len());
        let gelu = r.register(builtins.get(prims::GELU).unwrap().symbol.clone()).unwrap();
        assert_eq!(gelu, prims::GELU);
        let cube = Symbol::new("cube", Category::Elementwise).params(&[ParamKind::Tensor]).same_shape_as_first();
        assert_eq!(r.register(cube).unwrap().index(), square.index() + 1);
        assert_eq!((r.len(), r.is_empty()), (3, false));
        assert_eq!(r.names().collect::<Vec<_>>(), ["gelu", "square", "cube"]);
        let ids: Vec<_> = r.iter().map(|s| s.id).collect();
        assert_eq!(ids, [prims::GELU, square, SymbolId::from_index(square.index() + 1)]);
        assert_eq!(r.get(square).unwrap().symbol.name, "square");
        // A built-in's id the registry lacks names the built-in, and says where it comes from.
        let err = r.get(prims::NEG).unwrap_err();
        assert!(matches!(&err, Error::UnknownSymbol { name, .. } if name == "neg"), "{err}");
        assert!(err.to_string().contains("Registry::with_builtins()"), "{err}");
        assert!(Registry::empty().is_empty());
        // Built-ins registered in order after a user's symbol keep their ids too.
        let mut late = Registry::empty();
        let square = Symbol::new("square", Category::Elementwise).params(&[ParamKind::Tensor]).same_shape_as_first();
        late.register(square).unwrap();
        for symbol in prims::builtin_symbols() {
            let name = symbol.name.clone();
            assert_eq!(late.register(symbol).unwrap(), builtins.lookup(&name).unwrap(), "{name}");
        }
    }

    #[test]
    fn rejects_bad_definitions() {
        let mut r = Registry::with_builtins();
        let dup = Symbol::new("add", Category::Elementwise).params(&[ParamKind::Tensor]).same_shape_as_first();
        assert!(matches!(r.register(dup), Err(Error::DuplicateSymbol { .. })));
        let no_rule = Symbol::new("f", Category::Elementwise);
        assert!(matches!(r.register(no_rule), Err(Error::InvalidSymbol { .. })));
        let no_decomp = Symbol::new("g", Category::Composite).same_shape_as_first();
        assert!(matches!(r.register(no_decomp), Err(Error::InvalidSymbol { .. })));
        let bad_name = Symbol::new("a b", Category::Elementwise).same_shape_as_first();
        assert!(matches!(r.register(bad_name), Err(Error::InvalidSymbol { .. })));
        assert!(matches!(r.get(crate::SymbolId::from_index(999)), Err(Error::UnknownSymbol { .. })));
    }
}
