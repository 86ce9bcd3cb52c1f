//! Typed `u32` ids for the IR's entities, each printed with its own prefix (`t3`, `sym12`).
//!
//! Cross references in the IR are ids, never pointers, so that traces can live in an arena and
//! side tables (guards, buffers) can be keyed by them. One macro makes them all alike.

use std::fmt;

macro_rules! entity_id {
    ($(#[$meta:meta])* $name:ident, $prefix:literal) => {
        $(#[$meta])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(u32);

        impl $name {
            /// The id with this zero-based index.
            ///
            /// Indices above `u32::MAX` saturate; such an id never refers to anything and is
            /// reported as undefined wherever it is used.
            pub const fn from_index(index: usize) -> Self {
                if index > u32::MAX as usize {
                    Self(u32::MAX)
                } else {
                    Self(index as u32)
                }
            }

            /// The zero-based index of this id.
            pub const fn index(self) -> usize {
                self.0 as usize
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($prefix, "{}"), self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(self, f)
            }
        }
    };
}

entity_id!(
    /// A value (a tensor) in a trace, printed `t0`, `t1`, ...
    ///
    /// ```
    /// use boundscope::ValueId;
    /// assert_eq!(ValueId::from_index(3).to_string(), "t3");
    /// ```
    ValueId,
    "t"
);

entity_id!(
    /// A registered symbol (an op kind), printed `sym0`, `sym1`, ...
    ///
    /// Built-in symbols have fixed ids (see [`prims`](crate::prims)); user symbols get the
    /// following ids in registration order.
    ///
    /// ```
    /// assert_eq!(boundscope::prims::ADD.to_string(), "sym7");
    /// ```
    SymbolId,
    "sym"
);

entity_id!(
    /// A top-level bound symbol of a trace, by position, printed `op0`, `op1`, ...
    ///
    /// ```
    /// use boundscope::BoundSymbolId;
    /// assert_eq!(BoundSymbolId::from_index(2).to_string(), "op2");
    /// ```
    BoundSymbolId,
    "op"
);

entity_id!(
    /// A guard object attached somewhere in a trace, printed `g0`, `g1`, ...
    ///
    /// ```
    /// use boundscope::GuardId;
    /// assert_eq!(GuardId::from_index(1).to_string(), "g1");
    /// ```
    GuardId,
    "g"
);
