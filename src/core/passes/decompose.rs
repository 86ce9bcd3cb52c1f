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
            splice(&mut builder, bsym, bsym.comment());
        }
        builder.finish()
    }
}

/// Pushes `bsym`'s prims; the composite's comment goes to its first prim.
fn splice(builder: &mut TraceBuilder<'_>, bsym: &BoundSymbol<'_>, comment: Option<&str>) {
    if bsym.subsymbols().is_empty() {
        let mut prim = *bsym;
        prim.comment = comment.or(bsym.comment());
        builder.push_copy(&prim);
    } else {
        for (i, sub) in bsym.subsymbols().iter().enumerate() {
            splice(builder, sub, if i == 0 { comment } else { None });
        }
    }
}
