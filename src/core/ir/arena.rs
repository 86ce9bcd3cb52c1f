//! The caller-owned arena that traces are allocated in.
//!
//! `bumpalo` does the work, but it never appears in our public API: users see [`Arena`] and
//! nothing else, so the allocator can change without breaking them. Nothing that needs `Drop`
//! is ever put in the arena (bumpalo would not run it); this is asserted at compile time for the
//! IR types.

use std::cell::Cell;

use bumpalo::Bump;

/// Memory that traces are built in. Owned by the caller, reusable with [`Arena::reset`].
///
/// ```
/// use boundscope::{Arena, Registry, TraceBuilder};
///
/// let registry = Registry::with_builtins();
/// let mut arena = Arena::new();
/// for _ in 0..3 {
///     let mut b = TraceBuilder::new(&arena, &registry);
///     let x = b.input(&[4]).unwrap();
///     let y = b.exp(x).unwrap();
///     b.output(y).unwrap();
///     let trace = b.finish().unwrap();
///     assert_eq!(trace.len(), 1);
///     drop(trace);
///     arena.reset(); // keep the memory, forget the traces
/// }
/// ```
#[derive(Default)]
pub struct Arena {
    bump: Bump,
    /// The bound symbols and values of the last trace that a builder from
    /// [`TraceBuilder::new`](crate::TraceBuilder::new) finished in this arena, which the next
    /// such builder takes and reserves room for.
    last_trace: Cell<TraceSize>,
}

/// How many bound symbols and values a trace has.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct TraceSize {
    pub(crate) bound_symbols: usize,
    pub(crate) values: usize,
}

impl Arena {
    /// An empty arena; it allocates its first chunk on first use.
    pub fn new() -> Self {
        Self::default()
    }

    /// An arena with room for `bytes` bytes before it asks the system for more.
    pub fn with_capacity(bytes: usize) -> Self {
        Self { bump: Bump::with_capacity(bytes), last_trace: Cell::default() }
    }

    /// Forgets everything allocated, keeping the largest chunk for reuse, and the size of the
    /// last trace a builder from [`TraceBuilder::new`](crate::TraceBuilder::new) finished in it,
    /// which the next such builder reserves room for: a trace built again the same way does not
    /// grow its lists.
    ///
    /// Takes `&mut self`, so no trace built in this arena can still be alive.
    pub fn reset(&mut self) {
        self.bump.reset();
    }

    /// Bytes currently reserved from the system by this arena.
    pub fn allocated_bytes(&self) -> usize {
        self.bump.allocated_bytes()
    }

    /// The size of the last trace a builder from `TraceBuilder::new` finished in this arena,
    /// taken: the next call gets none until another such trace is finished.
    pub(crate) fn take_last_trace(&self) -> TraceSize {
        self.last_trace.take()
    }

    pub(crate) fn set_last_trace(&self, size: TraceSize) {
        self.last_trace.set(size);
    }

    pub(crate) fn bump(&self) -> &Bump {
        &self.bump
    }

    pub(crate) fn alloc_slice_copy<T: Copy>(&self, items: &[T]) -> &[T] {
        self.bump.alloc_slice_copy(items)
    }

    pub(crate) fn alloc_str(&self, s: &str) -> &str {
        self.bump.alloc_str(s)
    }
}

/// A growable list in the arena (no `Drop` of its items is ever run).
pub(crate) type ArenaVec<'a, T> = bumpalo::collections::Vec<'a, T>;

/// Fails to compile when `T` needs `Drop`: bumpalo never runs destructors, so such a value
/// would leak whatever it owns.
macro_rules! assert_no_drop {
    ($($t:ty),* $(,)?) => {
        $(const _: () = assert!(!std::mem::needs_drop::<$t>(), concat!(stringify!($t), " must not need Drop: it lives in the arena"));)*
    };
}
pub(crate) use assert_no_drop;
