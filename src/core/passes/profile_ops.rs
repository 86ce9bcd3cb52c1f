//! `ProfileOps`: an NVTX range on every bound symbol and every named scope, as metadata.

use std::sync::Arc;

use crate::core::guards::{Attachment, Guard, Level, NvtxRange};
use crate::core::ir::{Arena, Trace};
use crate::error::Result;

use super::Pass;

/// Attaches an [`NvtxRange`] to every bound symbol of the trace and to every named scope (one
/// range around each scope instance, labelled with its path: `h.3.attn`), and, with
/// [`with_trace_range`](Self::with_trace_range), one around each whole run.
/// [`scopes`](Self::scopes) and [`ops`](Self::ops) switch either part off.
///
/// This is the metadata counterpart of a transform that inserts `range_push`/`range_pop`
/// nodes around every op: the trace keeps its bound symbols and its length, and the listing
/// only gains a `# @nvtx` annotation per line.
///
/// It is idempotent: a bound symbol (or run) that already has an NVTX range in the pass's
/// domain gets no second one, so applying it twice gives the trace it gives once. With
/// [`skip_profiled`](Self::skip_profiled) it also leaves alone what has a range in any
/// domain (what the front end does to a trace the user already profiled).
///
/// ```
/// use boundscope::passes::{Pass, ProfileOps};
/// use boundscope::{Arena, ListingOptions, Registry, TraceBuilder};
/// let registry = Registry::with_builtins();
/// let arena = Arena::new();
/// let mut b = TraceBuilder::new(&arena, &registry);
/// let x = b.input(&[4]).unwrap();
/// let y = b.exp(x).unwrap();
/// b.output(y).unwrap();
/// let trace = b.finish().unwrap();
/// let profiled = ProfileOps::new().run(&trace, &arena).unwrap();
/// assert_eq!(profiled.len(), trace.len());
/// assert!(profiled.to_string().contains("t1 = exp(t0)  # @nvtx"));
/// let hidden = ListingOptions { guards: false, ..Default::default() };
/// assert_eq!(profiled.listing(hidden).to_string(), trace.listing(hidden).to_string());
/// let twice = ProfileOps::new().run(&profiled, &arena).unwrap();
/// assert_eq!(twice.to_string(), profiled.to_string());
/// ```
#[derive(Clone, Debug)]
pub struct ProfileOps {
    range: NvtxRange,
    trace_range: Option<NvtxRange>,
    skip_profiled: bool,
    ops: bool,
    scopes: bool,
}

impl Default for ProfileOps {
    fn default() -> Self {
        Self { range: NvtxRange::new(), trace_range: None, skip_profiled: false, ops: true, scopes: true }
    }
}

impl ProfileOps {
    /// Default ranges in the `boundscope` domain, labelled by symbol name (ops) and path
    /// (scopes).
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether every named scope gets a range (default: yes).
    ///
    /// ```
    /// use boundscope::passes::{Pass, ProfileOps};
    /// use boundscope::{Arena, Registry, TraceBuilder};
    /// let (registry, arena) = (Registry::with_builtins(), Arena::new());
    /// let mut b = TraceBuilder::new(&arena, &registry);
    /// let x = b.input(&[4]).unwrap();
    /// let y = b.scope("block", |b| b.exp(x)).unwrap();
    /// b.output(y).unwrap();
    /// let trace = b.finish().unwrap();
    /// let both = ProfileOps::new().run(&trace, &arena).unwrap();
    /// assert_eq!((both.scopes()[0].guard_count(), both.guard_attachment_count()), (1, 1));
    /// let scopes_only = ProfileOps::new().ops(false).run(&trace, &arena).unwrap();
    /// assert_eq!((scopes_only.scopes()[0].guard_count(), scopes_only.guard_attachment_count()), (1, 0));
    /// ```
    pub fn scopes(mut self, on: bool) -> Self {
        self.scopes = on;
        self
    }

    /// Whether every bound symbol gets a range (default: yes).
    pub fn ops(mut self, on: bool) -> Self {
        self.ops = on;
        self
    }

    /// Uses this range (domain, color, ...) for every op, and for every scope without its
    /// label (a scope's range is labelled with its path).
    pub fn with_range(mut self, range: NvtxRange) -> Self {
        self.range = range;
        self
    }

    /// Also attaches this range around every whole run.
    pub fn with_trace_range(mut self, range: NvtxRange) -> Self {
        self.trace_range = Some(range);
        self
    }

    /// Leaves alone every bound symbol (and run) that has an NVTX range in any domain, not only
    /// in this pass's domain.
    pub fn skip_profiled(mut self) -> Self {
        self.skip_profiled = true;
        self
    }

    /// Whether a guard already profiles what the new range would, for this pass.
    fn profiles(&self, existing: &dyn Guard, domain: &str) -> bool {
        existing.nvtx_domain().is_some_and(|d| self.skip_profiled || d == domain)
    }
}

impl Pass for ProfileOps {
    fn name(&self) -> &str {
        "profile_ops"
    }

    fn run<'a>(&self, trace: &Trace<'a>, _arena: &'a Arena) -> Result<Trace<'a>> {
        let mut profiled = trace.clone();
        let domain = self.range.domain_name();
        let table = &mut profiled.guards;
        let unprofiled: Vec<usize> = (0..trace.len())
            .filter(|&p| {
                self.ops
                    && !table
                        .at(p)
                        .iter()
                        .any(|a| a.depth == 0 && a.span == 1 && self.profiles(table.guard(a.guard), domain))
            })
            .collect();
        if !unprofiled.is_empty() {
            let id = table.add_guard(Arc::new(self.range.clone()));
            for p in unprofiled {
                let origin = trace.bound_symbols()[p].symbol();
                table.attach(p, Attachment { guard: id, span: 1, depth: 0, level: Level::Op, origin });
            }
        }
        if self.scopes {
            let unprofiled: Vec<usize> = (0..profiled.scopes.scopes.len())
                .filter(|&i| !profiled.scopes.scopes[i].guards.iter().any(|&g| self.profiles(table.guard(g), domain)))
                .collect();
            if !unprofiled.is_empty() {
                // Labelled by their paths, even when the ops' range has a label of its own.
                let id = table.add_guard(Arc::new(self.range.without_label()));
                for i in unprofiled {
                    profiled.scopes.scopes[i].guards.push(id);
                }
            }
        }
        if let Some(range) = &self.trace_range {
            let run_profiled = table.trace_level.iter().any(|&g| self.profiles(table.guard(g), range.domain_name()));
            if !run_profiled {
                profiled.attach_trace_guard(range.clone())?;
            }
        }
        Ok(profiled)
    }
}
