//! The open registry of symbols: built-ins first, then the user's own, each with a stable id.

use std::collections::HashMap;

use super::ids::SymbolId;
use super::prims;
use super::symbol::{Category, Symbol, SymbolRef};
use crate::error::{did_you_mean, Error, Result};

/// All symbols a trace may use. Built-in symbols have the fixed ids in [`prims`]; symbols
/// registered later get the following ids in order.
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
    symbols: Vec<Symbol>,
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
        Self { symbols: Vec::new(), by_name: HashMap::new(), generation: next_generation() }
    }
}

impl Clone for Registry {
    fn clone(&self) -> Self {
        Self { symbols: self.symbols.clone(), by_name: self.by_name.clone(), generation: next_generation() }
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

    /// Adds a symbol and returns its id.
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
        self.generation = next_generation();
        let id = SymbolId::from_index(self.symbols.len());
        self.by_name.insert(symbol.name.clone(), id);
        self.symbols.push(symbol);
        Ok(id)
    }

    /// The symbol with this id.
    ///
    /// # Errors
    /// [`Error::UnknownSymbol`] if no symbol has this id.
    pub fn get(&self, id: SymbolId) -> Result<SymbolRef<'_>> {
        self.symbols
            .get(id.index())
            .map(|symbol| SymbolRef { id, symbol })
            .ok_or_else(|| Error::UnknownSymbol { name: id.to_string(), suggestion: None })
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
        self.symbols.iter().map(|s| s.name.as_str())
    }

    /// Every registered symbol, in id order.
    pub fn iter(&self) -> impl Iterator<Item = SymbolRef<'_>> {
        self.symbols.iter().enumerate().map(|(i, symbol)| SymbolRef { id: SymbolId::from_index(i), symbol })
    }

    /// Number of registered symbols.
    pub fn len(&self) -> usize {
        self.symbols.len()
    }

    /// Whether no symbol is registered.
    pub fn is_empty(&self) -> bool {
        self.symbols.is_empty()
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
