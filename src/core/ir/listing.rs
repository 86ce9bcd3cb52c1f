//! Printing a trace as a readable program.

use std::fmt;

use super::bound_symbol::BoundSymbol;
use super::meta::DimsDisplay;
use super::trace::Trace;

/// What a listing shows. `Display` for a trace uses the defaults.
///
/// ```
/// use boundscope::{Arena, ListingOptions, Registry, TraceBuilder};
/// let registry = Registry::with_builtins();
/// let arena = Arena::new();
/// let mut b = TraceBuilder::new(&arena, &registry);
/// let x = b.input(&[2, 3]).unwrap();
/// let y = b.softmax(x).unwrap();
/// b.output(y).unwrap();
/// let trace = b.finish().unwrap();
/// let full = trace.to_string();
/// assert!(full.contains("# t1 = max(t0)"));
/// let brief = trace.listing(ListingOptions { subsymbols: false, ..Default::default() }).to_string();
/// assert!(!brief.contains("exp("));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ListingOptions {
    /// Print each composite's decomposition as indented comment lines beneath it.
    pub subsymbols: bool,
    /// Print the header (bound symbol count and the passes that built the trace).
    pub header: bool,
    /// Print guard annotations (`# @nvtx`). With `false`, a guarded trace lists exactly like
    /// the same trace without guards.
    pub guards: bool,
    /// Print a `# scope h.3.attn (4 ops)` line before the first bound symbol of each named
    /// scope (with its guards, when `guards` is on). With `false`, a trace lists exactly like
    /// the same trace built without scopes.
    ///
    /// ```
    /// use boundscope::{Arena, ListingOptions, Registry, TraceBuilder};
    /// let (registry, arena) = (Registry::with_builtins(), Arena::new());
    /// let mut b = TraceBuilder::new(&arena, &registry);
    /// let x = b.input(&[4]).unwrap();
    /// let y = b.scope("h", |b| b.scope("0", |b| { let e = b.exp(x)?; b.neg(e) })).unwrap();
    /// b.output(y).unwrap();
    /// let listing = b.finish().unwrap().to_string();
    /// assert!(listing.contains("  # scope h (2 ops)\n  # scope h.0 (2 ops)\n  t1 = exp(t0)"), "{listing}");
    /// ```
    pub scopes: bool,
}

impl Default for ListingOptions {
    fn default() -> Self {
        Self { subsymbols: true, header: true, guards: true, scopes: true }
    }
}

/// A trace with listing options; `Display` prints it.
pub struct Listing<'t, 'a> {
    trace: &'t Trace<'a>,
    options: ListingOptions,
}

impl<'a> Trace<'a> {
    /// The trace's listing with these options.
    pub fn listing(&self, options: ListingOptions) -> Listing<'_, 'a> {
        Listing { trace: self, options }
    }
}

impl fmt::Display for Trace<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.listing(ListingOptions::default()).fmt(f)
    }
}

impl fmt::Display for Listing<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let trace = self.trace;
        if self.options.header {
            let n = trace.len();
            writeln!(f, "# boundscope trace: {n} bound symbol{}", if n == 1 { "" } else { "s" })?;
            if !trace.history.is_empty() {
                write!(f, "# passes:")?;
                for (i, record) in trace.history.iter().enumerate() {
                    write!(f, "{} {} ({:.1?})", if i == 0 { "" } else { "," }, record.name, record.elapsed)?;
                }
                writeln!(f)?;
            }
        }
        if self.options.guards {
            let guards = &trace.guards;
            if !guards.trace_level.is_empty() {
                write!(f, "# guards around every run:")?;
                for &g in &guards.trace_level {
                    write!(f, " {}", guards.guard(g).kind())?;
                    if let Some(label) = guards.guard(g).label() {
                        write!(f, "({label:?})")?;
                    }
                }
                writeln!(f)?;
            }
            if !guards.dropped.is_empty() {
                writeln!(f, "# guards dropped by passes: {} (see Trace::dropped_guards)", guards.dropped.len())?;
            }
        }
        write!(f, "def trace(")?;
        for (i, &input) in trace.inputs.iter().enumerate() {
            let sep = if i == 0 { "" } else { ", " };
            match trace.meta(input) {
                Some(m) => write!(f, "{sep}{input}: {}{}", m.dtype, DimsDisplay(m.shape))?,
                None => write!(f, "{sep}{input}")?,
            }
        }
        writeln!(f, "):")?;
        let mut scopes = trace.scopes().iter().peekable();
        for (position, bsym) in trace.bound_symbols.iter().enumerate() {
            while let Some(scope) = scopes.next_if(|s| s.positions().start == position) {
                if self.options.scopes {
                    self.write_scope(f, scope)?;
                }
            }
            self.write_bound_symbol(f, bsym, 0, Some(position))?;
        }
        write!(f, "  return (")?;
        for (i, o) in trace.outputs.iter().enumerate() {
            write!(f, "{}{o}", if i == 0 { "" } else { ", " })?;
        }
        writeln!(f, "{})", if trace.outputs.len() == 1 { "," } else { "" })
    }
}

impl Listing<'_, '_> {
    fn write_bound_symbol(
        &self,
        f: &mut fmt::Formatter<'_>,
        bsym: &BoundSymbol<'_>,
        depth: usize,
        position: Option<usize>,
    ) -> fmt::Result {
        let indent = 2 + 2 * depth;
        let marker = if depth == 0 { "" } else { "# " };
        if let Some(comment) = bsym.comment() {
            writeln!(f, "{:indent$}# {comment}", "")?;
        }
        write!(f, "{:indent$}{marker}", "")?;
        for (i, o) in bsym.outputs.iter().enumerate() {
            write!(f, "{}{o}", if i == 0 { "" } else { ", " })?;
        }
        write!(f, " = {}(", self.trace.symbol_name(bsym))?;
        for (i, a) in bsym.args.iter().enumerate() {
            write!(f, "{}{a}", if i == 0 { "" } else { ", " })?;
        }
        write!(f, ")")?;
        if let (true, Some(position)) = (self.options.guards, position) {
            self.write_guard_annotations(f, position)?;
        }
        writeln!(f)?;
        if self.options.subsymbols {
            for sub in bsym.subsymbols {
                self.write_bound_symbol(f, sub, depth + 1, None)?;
            }
        }
        Ok(())
    }
}

impl Listing<'_, '_> {
    /// `  # scope h.3.attn (4 ops)  # @nvtx` before a scope's first bound symbol.
    fn write_scope(&self, f: &mut fmt::Formatter<'_>, scope: &super::scopes::NamedScope) -> fmt::Result {
        let n = scope.positions().len();
        write!(f, "  # scope {} ({n} op{})", scope.path(), if n == 1 { "" } else { "s" })?;
        if self.options.guards {
            let guards = &self.trace.guards;
            for (i, &g) in scope.guards.iter().enumerate() {
                write!(f, "{}{}", if i == 0 { "  # " } else { " " }, guards.guard(g).kind())?;
                if let Some(label) = guards.guard(g).label() {
                    write!(f, "({label:?})")?;
                }
            }
        }
        writeln!(f)
    }

    /// `  # @nvtx @timer(softmax: 5 ops)` after a guarded bound symbol.
    fn write_guard_annotations(&self, f: &mut fmt::Formatter<'_>, position: usize) -> fmt::Result {
        let guards = &self.trace.guards;
        for (i, a) in guards.at(position).iter().enumerate() {
            let guard = guards.guard(a.guard);
            write!(f, "{}{}", if i == 0 { "  # " } else { " " }, guard.kind())?;
            let label = guard.label().map(|l| format!("{l:?}"));
            let origin = || self.trace.registry.get(a.origin).map(|s| s.symbol.name().to_string()).unwrap_or_default();
            match (label, a.depth, a.span) {
                (label, depth, _) if depth > 0 => {
                    write!(f, "({}subsymbols to depth {depth})", label.map(|l| l + ", ").unwrap_or_default())?
                }
                (Some(label), _, 1) => write!(f, "({label})")?,
                (label, _, span) if span > 1 => {
                    write!(f, "({}: {span} ops)", label.unwrap_or_else(origin))?;
                }
                _ => {}
            }
        }
        Ok(())
    }
}
