//! Attaching guards to a trace, from code: to one bound symbol, a selection, the whole trace,
//! or the subsymbols of a composite.

use std::ops::Range;
use std::sync::Arc;

use super::table::Attachment;
use super::{check_guard, Guard, Level};
use crate::core::ir::{BoundSymbol, BoundSymbolId, GuardId, Trace};
use crate::error::{Error, Result};

/// Which top-level bound symbols of a trace to attach a guard to.
///
/// ```
/// use boundscope::guards::{HostTimer, Selection};
/// use boundscope::{Arena, BoundSymbolId, Category, Registry, TraceBuilder};
/// let registry = Registry::with_builtins();
/// let arena = Arena::new();
/// let mut b = TraceBuilder::new(&arena, &registry);
/// let x = b.input(&[2, 2]).unwrap();
/// let y = b.exp(x).unwrap();
/// let z = b.matmul(y, y).unwrap();
/// let w = b.add(z, x).unwrap();
/// b.output(w).unwrap();
/// let mut trace = b.finish().unwrap();
/// let timer = HostTimer::new();
/// assert_eq!(trace.attach_guard(Selection::Op(BoundSymbolId::from_index(0)), timer.clone()).unwrap(), 1);
/// assert_eq!(trace.attach_guard(Selection::Named("matmul"), timer.clone()).unwrap(), 1);
/// assert_eq!(trace.attach_guard(Selection::Positions(1..3), timer.clone()).unwrap(), 2);
/// let is_matmul = |_: &boundscope::BoundSymbol<'_>, category: Category| category == Category::Matmul;
/// assert_eq!(trace.attach_guard(Selection::Where(&is_matmul), timer.clone()).unwrap(), 1);
/// assert_eq!(trace.attach_guard(Selection::All, timer).unwrap(), 3);
/// ```
#[derive(Clone)]
#[non_exhaustive]
pub enum Selection<'s> {
    /// One bound symbol.
    Op(BoundSymbolId),
    /// Every bound symbol of the symbol with this name.
    Named(&'s str),
    /// The bound symbols at these positions. As with slicing, an empty range (`2..2`) selects
    /// nothing, and a reversed one (`3..1`) is an error.
    Positions(Range<usize>),
    /// Every bound symbol for which the predicate (given the bound symbol and its symbol's
    /// category) is true.
    Where(&'s dyn Fn(&BoundSymbol<'_>, crate::Category) -> bool),
    /// Every bound symbol.
    All,
    /// Each scope whose path matches the pattern ([`path_matches`](crate::path_matches):
    /// `h.*.attn`, `**` for every scope), as a whole: one range around each scope instance per
    /// NVTX domain, labelled with the scope's path unless the guard gives a label. Only
    /// [`Trace::attach_guard`] and [`Trace::attach_shared_guard`] take it; it counts scopes.
    ///
    /// ```
    /// use boundscope::guards::{NvtxRange, Selection};
    /// use boundscope::{Arena, Error, Registry, TraceBuilder};
    /// let (registry, arena) = (Registry::with_builtins(), Arena::new());
    /// let mut b = TraceBuilder::new(&arena, &registry);
    /// let mut x = b.input(&[8]).unwrap();
    /// for i in 0..3 {
    ///     x = b.scope("h", |b| b.scope(&i.to_string(), |b| b.scope("attn", |b| b.exp(x)))).unwrap();
    /// }
    /// b.output(x).unwrap();
    /// let mut trace = b.finish().unwrap();
    /// assert_eq!(trace.attach_guard(Selection::Scope("h.*.attn"), NvtxRange::new()).unwrap(), 3);
    /// assert_eq!(trace.attach_guard(Selection::InScope("h.1"), NvtxRange::new()).unwrap(), 1); // its op
    /// let typo = trace.attach_guard(Selection::Scope("h.*.atn"), NvtxRange::new()).unwrap_err();
    /// assert!(matches!(typo, Error::NoSuchScope { .. }));
    /// ```
    Scope(&'s str),
    /// The bound symbols inside each scope whose path matches the pattern, one by one.
    InScope(&'s str),
}

fn max_depth(bsym: &BoundSymbol<'_>) -> usize {
    bsym.subsymbols().iter().map(|s| 1 + max_depth(s)).max().unwrap_or(0)
}

impl<'a> Trace<'a> {
    /// Attaches `guard` to the selected bound symbols and returns how many were selected.
    /// One guard object is shared by all of them; each is prepared separately per plan site.
    ///
    /// Attaching changes neither the bound symbols, nor their order, nor the listing apart
    /// from guard annotations.
    ///
    /// # Errors
    /// [`Error::InvalidBoundSymbol`] for a position past the end, [`Error::ReversedRange`] for
    /// positions whose start is after their end, [`Error::UnknownSymbol`] for a name no symbol
    /// has, [`Error::NoSuchScope`] for a scope pattern that matches no scope,
    /// [`Error::InvalidLabel`] for a guard with a bad label or NVTX domain name (empty, or with a NUL).
    pub fn attach_guard(&mut self, selection: Selection<'_>, guard: impl Guard) -> Result<usize> {
        self.attach_shared_guard(selection, Arc::new(guard))
    }

    /// Like [`attach_guard`](Self::attach_guard) for a guard object that is already shared.
    ///
    /// # Errors
    /// As for [`attach_guard`](Self::attach_guard).
    pub fn attach_shared_guard(&mut self, selection: Selection<'_>, guard: Arc<dyn Guard>) -> Result<usize> {
        check_guard(&*guard)?;
        if let Selection::Scope(pattern) = selection {
            let matching = self.scopes.matching(pattern)?;
            let id = self.guards.add_guard(guard);
            for &i in &matching {
                let guards = &mut self.scopes.scopes[i].guards;
                if !guards.contains(&id) {
                    guards.push(id);
                }
            }
            return Ok(matching.len());
        }
        let positions = self.select(selection)?;
        let id = self.guards.add_guard(guard);
        for &position in &positions {
            let origin = self.bound_symbols[position].symbol();
            self.guards.attach(position, Attachment { guard: id, span: 1, depth: 0, level: Level::Op, origin });
        }
        Ok(positions.len())
    }

    /// Attaches `guard` around every run of the whole trace.
    ///
    /// # Errors
    /// [`Error::InvalidLabel`] for a guard with a bad label or NVTX domain name (empty, or with a NUL).
    pub fn attach_trace_guard(&mut self, guard: impl Guard) -> Result<GuardId> {
        check_guard(&guard)?;
        let id = self.guards.add_guard(Arc::new(guard));
        self.guards.trace_level.push(id);
        Ok(id)
    }

    /// Attaches `guard` to each subsymbol of a composite, down to `depth` levels of its
    /// decomposition (1: its direct subsymbols). Returns how many subsymbols it covers. The
    /// ranges report [`Level::Subsymbol`] and nest inside the composite's own range.
    ///
    /// ```
    /// use boundscope::guards::Recorder;
    /// use boundscope::{Arena, BoundSymbolId, Error, Registry, TraceBuilder};
    /// let registry = Registry::with_builtins();
    /// let arena = Arena::new();
    /// let mut b = TraceBuilder::new(&arena, &registry);
    /// let x = b.input(&[2, 4]).unwrap();
    /// let y = b.softmax(x).unwrap();
    /// b.output(y).unwrap();
    /// let mut trace = b.finish().unwrap();
    /// let softmax = BoundSymbolId::from_index(0);
    /// assert_eq!(trace.attach_subsymbol_guard(softmax, 1, Recorder::new()).unwrap(), 5);
    /// let err = trace.attach_subsymbol_guard(softmax, 2, Recorder::new()).unwrap_err();
    /// assert!(matches!(err, Error::DepthOutOfRange { depth: 2, max: 1, .. }));
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidBoundSymbol`], or [`Error::DepthOutOfRange`] when `depth` is 0 or
    /// deeper than the composite's decomposition.
    pub fn attach_subsymbol_guard(&mut self, op: BoundSymbolId, depth: usize, guard: impl Guard) -> Result<usize> {
        check_guard(&guard)?;
        let bsym = self.bound_symbol(op)?;
        let max = max_depth(bsym);
        if depth == 0 || depth > max || depth > u8::MAX as usize {
            return Err(Error::DepthOutOfRange { op: op.index(), depth, max });
        }
        let covered = count_subsymbols(bsym, depth);
        let origin = bsym.symbol();
        let id = self.guards.add_guard(Arc::new(guard));
        self.guards
            .attach(op.index(), Attachment { guard: id, span: 1, depth: depth as u8, level: Level::Subsymbol, origin });
        Ok(covered)
    }

    /// The top-level bound symbol with this id.
    ///
    /// # Errors
    /// [`Error::InvalidBoundSymbol`] if the trace has no such bound symbol.
    pub fn bound_symbol(&self, op: BoundSymbolId) -> Result<&'a BoundSymbol<'a>> {
        self.bound_symbols.get(op.index()).ok_or(Error::InvalidBoundSymbol { index: op.index(), len: self.len() })
    }

    /// The guards that passes dropped, with their reasons.
    pub fn dropped_guards(&self) -> &[super::DroppedGuard] {
        &self.guards.dropped
    }

    /// Number of guard attachments (trace-level ones included).
    pub fn guard_attachment_count(&self) -> usize {
        self.guards.attachment_count()
    }

    /// The kinds of the guards attached directly to a top-level bound symbol, in attach order.
    pub fn guard_kinds_at(&self, op: BoundSymbolId) -> Vec<super::GuardKind> {
        self.guards.at(op.index()).iter().map(|a| self.guards.guard(a.guard).kind()).collect()
    }

    fn select(&self, selection: Selection<'_>) -> Result<Vec<usize>> {
        let len = self.len();
        Ok(match selection {
            Selection::Op(op) => {
                self.bound_symbol(op)?;
                vec![op.index()]
            }
            Selection::Named(name) => {
                let id = self.registry.lookup(name)?;
                (0..len).filter(|&i| self.bound_symbols[i].symbol() == id).collect()
            }
            Selection::Positions(range) => {
                if range.start > range.end {
                    return Err(Error::ReversedRange { start: range.start, end: range.end });
                }
                if range.end > len {
                    // The first position of the range that does not exist.
                    return Err(Error::InvalidBoundSymbol { index: range.start.max(len), len });
                }
                range.collect()
            }
            Selection::Where(predicate) => (0..len)
                .filter(|&i| {
                    let bsym = &self.bound_symbols[i];
                    let category = self.registry.get(bsym.symbol()).map(|s| s.symbol.category());
                    category.is_ok_and(|c| predicate(bsym, c))
                })
                .collect(),
            Selection::All => (0..len).collect(),
            Selection::InScope(pattern) => {
                let mut positions: Vec<usize> = self
                    .scopes
                    .matching(pattern)?
                    .into_iter()
                    .flat_map(|i| self.scopes.scopes[i].positions())
                    .collect();
                positions.sort_unstable();
                positions.dedup();
                positions
            }
            Selection::Scope(_) => Vec::new(),
        })
    }
}

/// Number of subsymbols at depths 1..=depth.
pub(crate) fn count_subsymbols(bsym: &BoundSymbol<'_>, depth: usize) -> usize {
    if depth == 0 {
        return 0;
    }
    bsym.subsymbols().iter().map(|s| 1 + count_subsymbols(s, depth - 1)).sum()
}
