//! Folding an activation into the product before it: `gelu(linear(x, w, b))` becomes one
//! `linear_gelu(x, w, b)`, which an executor with a fused epilogue (cuBLASLt's `GELU_BIAS`)
//! runs as one product, and which decomposes back into the same two bound symbols for every
//! other executor.

use crate::core::ir::{prims, Arena, BoundSymbol, Trace, TraceBuilder};
use crate::error::Result;

use super::Pass;

/// Replaces each built-in `linear` followed directly by a built-in `gelu` of its result, which
/// nothing else reads (nor returns), by one `linear_gelu` whose subsymbols are the two. The
/// composite's decomposition is those two bound symbols, so a plan whose executors do not run
/// it whole (the CPU executors, say) runs exactly what it ran before. A trace with guards on
/// its bound symbols is left as it is (a guard on either op would have to choose between
/// surrounding both or being dropped); profile after this pass, as the front end does.
///
/// ```
/// use boundscope::passes::{FoldEpilogues, Pass};
/// use boundscope::{prims, Arena, Registry, TraceBuilder};
/// let registry = Registry::with_builtins();
/// let arena = Arena::new();
/// let mut b = TraceBuilder::new(&arena, &registry);
/// let x = b.input(&[2, 4]).unwrap();
/// let w = b.input(&[3, 4]).unwrap();
/// let h = b.linear(x, w, None).unwrap();
/// let g = b.gelu(h).unwrap();
/// b.output(g).unwrap();
/// let folded = FoldEpilogues.run(&b.finish().unwrap(), &arena).unwrap();
/// assert_eq!(folded.len(), 1);
/// assert_eq!(folded.bound_symbols()[0].symbol(), prims::LINEAR_GELU);
/// assert_eq!(folded.bound_symbols()[0].outputs(), &[g]);
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct FoldEpilogues;

impl Pass for FoldEpilogues {
    fn name(&self) -> &str {
        "fold_epilogues"
    }

    fn run<'a>(&self, trace: &Trace<'a>, arena: &'a Arena) -> Result<Trace<'a>> {
        if trace.guards.per_op.iter().any(|a| !a.is_empty()) {
            return Ok(trace.clone());
        }
        let bsyms = trace.bound_symbols();
        let reads = super::top_level_reads(trace);
        let registry = trace.registry();
        let builtin = |b: &BoundSymbol<'_>| registry.get(b.symbol()).ok().and_then(|s| s.symbol.builtin_composite());
        let prim = |b: &BoundSymbol<'_>| registry.get(b.symbol()).ok().and_then(|s| s.symbol.builtin_prim());
        let mut builder = TraceBuilder::rewrite(trace, arena);
        // Where each old bound symbol went: both of a folded pair to their composite.
        let mut new_position = Vec::with_capacity(bsyms.len());
        let mut p = 0;
        while p < bsyms.len() {
            let pair = bsyms.get(p).zip(bsyms.get(p + 1)).filter(|(linear, gelu)| {
                let [h] = linear.outputs() else { return false };
                builtin(linear) == Some(prims::LINEAR)
                    && prim(gelu) == Some(prims::GELU)
                    && gelu.inputs().eq([*h])
                    && reads.get(h.index()) == Some(&1)
            });
            match pair {
                Some((linear, gelu)) => {
                    let subsymbols = arena.bump().alloc_slice_copy(&[*linear, *gelu]);
                    let folded = BoundSymbol {
                        symbol: prims::LINEAR_GELU,
                        args: linear.args(),
                        outputs: gelu.outputs(),
                        subsymbols,
                        extras: None,
                    };
                    new_position.extend([Some(builder.len()); 2]);
                    builder.push_copy_with_comment(&folded, linear.comment());
                    p += 2;
                }
                None => {
                    new_position.push(Some(builder.len()));
                    builder.push_copy(&bsyms[p]);
                    p += 1;
                }
            }
        }
        // Whole-run guards (per-op ones would have stopped the fold above).
        builder.carry_guards(trace, &new_position, self.name(), |_| String::new())?;
        builder.finish()
    }
}
