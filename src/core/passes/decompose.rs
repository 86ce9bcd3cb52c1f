//! Decomposition: replace every composite with the prims it is made of.

use crate::core::ir::{Arena, BoundSymbol, Trace, TraceBuilder};
use crate::error::Result;

use super::Pass;

/// Replaces each composite bound symbol by its subsymbols, recursively, leaving only prims.
///
/// The subsymbols already use the trace's own value ids, so the replacement is a splice.
#[derive(Clone, Copy, Debug, Default)]
pub struct Decompose;

impl Pass for Decompose {
    fn name(&self) -> &str {
        "decompose"
    }

    fn run<'a>(&self, trace: &Trace<'a>, arena: &'a Arena) -> Result<Trace<'a>> {
        let mut builder = TraceBuilder::rewrite(trace, arena);
        for bsym in trace.bound_symbols() {
            splice(&mut builder, bsym);
        }
        builder.finish()
    }
}

fn splice(builder: &mut TraceBuilder<'_>, bsym: &BoundSymbol<'_>) {
    if bsym.subsymbols().is_empty() {
        builder.push_copy(bsym);
    } else {
        for sub in bsym.subsymbols() {
            splice(builder, sub);
        }
    }
}
