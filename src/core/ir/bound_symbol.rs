//! Bound symbols: a symbol applied to arguments, producing values.

use std::fmt;

use super::ids::{SymbolId, ValueId};

/// One argument of a bound symbol.
///
/// ```
/// use boundscope::{Arg, ValueId};
/// let v = ValueId::from_index(1);
/// assert_eq!(Arg::from(v), Arg::Value(v));
/// assert_eq!(Arg::from(2.5), Arg::Scalar(2.5));
/// assert_eq!(Arg::Dims(&[1, 0]).to_string(), "[1, 0]");
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Arg<'a> {
    /// A tensor value defined earlier in the trace.
    Value(ValueId),
    /// An `f32` scalar.
    Scalar(f32),
    /// A list of dimensions (a shape or a permutation).
    Dims(&'a [usize]),
    /// An element type (`cast`'s target).
    DType(super::meta::DType),
}

impl Arg<'_> {
    /// The value, if this argument is one.
    pub fn value(&self) -> Option<ValueId> {
        match self {
            Arg::Value(v) => Some(*v),
            _ => None,
        }
    }

    pub(crate) fn kind_name(&self) -> &'static str {
        match self {
            Arg::Value(_) => "tensor",
            Arg::Scalar(_) => "scalar",
            Arg::Dims(_) => "list of dimensions",
            Arg::DType(_) => "dtype",
        }
    }
}

impl From<ValueId> for Arg<'_> {
    fn from(v: ValueId) -> Self {
        Arg::Value(v)
    }
}

impl From<f32> for Arg<'_> {
    fn from(s: f32) -> Self {
        Arg::Scalar(s)
    }
}

impl fmt::Display for Arg<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Arg::Value(v) => write!(f, "{v}"),
            Arg::Scalar(s) => write!(f, "{s:?}"),
            Arg::Dims(d) => write!(f, "{}", super::meta::DimsDisplay(d)),
            Arg::DType(d) => write!(f, "{d}"),
        }
    }
}

/// A symbol applied to arguments, producing output values; a composite also holds its
/// decomposition as subsymbols. Lives in the arena; copy it freely.
///
/// ```
/// use boundscope::{prims, Arena, Registry, TraceBuilder};
/// let registry = Registry::with_builtins();
/// let arena = Arena::new();
/// let mut b = TraceBuilder::new(&arena, &registry);
/// let x = b.input(&[2, 4]).unwrap();
/// let y = b.softmax(x).unwrap();
/// b.output(y).unwrap();
/// let trace = b.finish().unwrap();
/// let softmax = trace.bound_symbols()[0];
/// assert_eq!(softmax.symbol(), prims::SOFTMAX);
/// assert_eq!(softmax.outputs(), &[y]);
/// assert_eq!(softmax.subsymbols().len(), 5); // max, sub, exp, sum, div
/// ```
#[derive(Clone, Copy, Debug)]
pub struct BoundSymbol<'a> {
    pub(crate) symbol: SymbolId,
    pub(crate) args: &'a [Arg<'a>],
    pub(crate) outputs: &'a [ValueId],
    pub(crate) subsymbols: &'a [BoundSymbol<'a>],
    /// What few bound symbols have, kept apart so that a bound symbol is 64 bytes: a trace
    /// copies its list of them as the list grows.
    pub(crate) extras: Option<&'a Extras<'a>>,
}

// Kept small: a trace's list of bound symbols is written, and copied as it grows, once per op.
#[cfg(target_pointer_width = "64")]
const _: () = assert!(std::mem::size_of::<BoundSymbol<'static>>() == 64);

/// A bound symbol's comment, own name and fusion mark, where it has any.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Extras<'a> {
    pub(crate) comment: Option<&'a str>,
    /// The name listings and ranges use instead of the symbol's (fusion regions:
    /// `CpuFusion0`).
    pub(crate) name: Option<&'a str>,
    /// For a fusion region: whose fusion made it (set only by `passes::FuseRegions`, kept by
    /// copies).
    pub(crate) fused_by: Option<FusedBy>,
}

impl<'a> Extras<'a> {
    /// Extras holding only `comment`, in `arena`; none without a comment.
    pub(crate) fn comment(arena: &'a crate::Arena, comment: Option<&'a str>) -> Option<&'a Extras<'a>> {
        comment.map(|c| &*arena.bump().alloc(Extras { comment: Some(c), ..Extras::default() }))
    }
}

/// Which executor's fusion made a region: the concrete type of the executor that
/// `passes::FuseRegions` was given. An executor runs only the regions made for its own type
/// ([`OpView::is_region_of`](crate::OpView::is_region_of)); unlike a name, no user code can
/// forge it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FusedBy(std::any::TypeId);

impl FusedBy {
    /// The mark of regions made for `executor`.
    pub(crate) fn of(executor: &dyn crate::core::plan::Executor) -> Self {
        let executor: &dyn std::any::Any = executor;
        Self(executor.type_id())
    }
}

impl<'a> BoundSymbol<'a> {
    /// The symbol applied.
    pub fn symbol(&self) -> SymbolId {
        self.symbol
    }

    /// All arguments, in order.
    pub fn args(&self) -> &'a [Arg<'a>] {
        self.args
    }

    /// The tensor arguments, in order.
    pub fn inputs(&self) -> impl Iterator<Item = ValueId> + 'a {
        self.args.iter().filter_map(Arg::value)
    }

    /// The values it defines.
    pub fn outputs(&self) -> &'a [ValueId] {
        self.outputs
    }

    /// Its decomposition (empty for prims).
    pub fn subsymbols(&self) -> &'a [BoundSymbol<'a>] {
        self.subsymbols
    }

    /// Its own name, if it has one instead of its symbol's (fusion regions are named
    /// `<Executor>Fusion<N>`).
    pub fn name(&self) -> Option<&'a str> {
        self.extras.and_then(|e| e.name)
    }

    /// The header comment printed above it in listings, if any.
    pub fn comment(&self) -> Option<&'a str> {
        self.extras.and_then(|e| e.comment)
    }

    /// For a fusion region: whose fusion made it.
    pub(crate) fn fused_by(&self) -> Option<FusedBy> {
        self.extras.and_then(|e| e.fused_by)
    }
}
