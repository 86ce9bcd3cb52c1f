//! The intermediate representation: symbols, bound symbols and traces in a caller-owned arena.

mod arena;
mod bound_symbol;
mod builder;
mod gradient_ops;
mod ids;
mod listing;
mod meta;
pub mod optimizers;
mod packed_attention;
pub mod prims;
mod registry;
mod scopes;
mod symbol;
mod trace;
mod transformer_ops;

pub use arena::Arena;
pub(crate) use bound_symbol::FusedBy;
pub use bound_symbol::{Arg, BoundSymbol};
pub use builder::TraceBuilder;
pub(crate) use gradient_ops::{full_of_shape, wide};
pub use ids::{BoundSymbolId, GuardId, SymbolId, ValueId};
pub use listing::{Listing, ListingOptions};
pub use meta::{checked_numel, DType, Shape, TensorMeta};
pub(crate) use meta::{unusable_shape_detail, DimsDisplay};
#[cfg(feature = "cuda")]
pub(crate) use packed_attention::PackedHeads;
pub use registry::Registry;
pub use scopes::{path_matches, NamedScope, SCOPE_SEPARATOR};
pub use symbol::{
    ArgInfo, Category, CpuKernelFactory, Decomposition, ParamKind, ShapeRule, Symbol, SymbolRef, VjpInput, VjpRule,
};
pub use trace::{PassRecord, Trace};
pub(crate) use transformer_ops::attention_gradients;
