//! Dead-code elimination: drop bound symbols whose results nobody uses.

use crate::core::ir::{Arena, Trace, TraceBuilder};
use crate::error::Result;

use super::Pass;

/// Removes every top-level bound symbol none of whose outputs reaches a trace output.
#[derive(Clone, Copy, Debug, Default)]
pub struct DeadCodeElimination;

impl Pass for DeadCodeElimination {
    fn name(&self) -> &str {
        "dead_code_elimination"
    }

    fn run<'a>(&self, trace: &Trace<'a>, arena: &'a Arena) -> Result<Trace<'a>> {
        let mut live = vec![false; trace.value_count()];
        for &o in trace.outputs() {
            if let Some(l) = live.get_mut(o.index()) {
                *l = true;
            }
        }
        let mut keep = vec![false; trace.len()];
        for (i, bsym) in trace.bound_symbols().iter().enumerate().rev() {
            if bsym.outputs().iter().any(|o| live.get(o.index()).copied().unwrap_or(false)) {
                keep[i] = true;
                for input in bsym.inputs() {
                    if let Some(l) = live.get_mut(input.index()) {
                        *l = true;
                    }
                }
            }
        }
        let mut builder = TraceBuilder::rewrite(trace, arena);
        let mut new_position = Vec::with_capacity(trace.len());
        for (bsym, &kept) in trace.bound_symbols().iter().zip(&keep) {
            new_position.push(kept.then(|| builder.len()));
            if kept {
                builder.push_copy(bsym);
            }
        }
        builder.carry_guards(trace, &new_position, self.name(), |old| {
            format!(
                "`{}` (bound symbol {old}) was removed as dead code: none of its outputs reaches the trace's outputs",
                trace.symbol_name(&trace.bound_symbols()[old])
            )
        })?;
        builder.finish()
    }
}
