//! `ProfileOps`: an NVTX range on every bound symbol, as metadata.

use crate::core::guards::{NvtxRange, Selection};
use crate::core::ir::{Arena, Trace};
use crate::error::Result;

use super::Pass;

/// Attaches an [`NvtxRange`] to every bound symbol of the trace (and, with
/// [`with_trace_range`](Self::with_trace_range), one around each whole run).
///
/// This is the metadata counterpart of a transform that inserts `range_push`/`range_pop`
/// nodes around every op: the trace keeps its bound symbols and its length, and the listing
/// only gains a `# @nvtx` annotation per line.
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
/// ```
#[derive(Clone, Debug, Default)]
pub struct ProfileOps {
    range: NvtxRange,
    trace_range: Option<NvtxRange>,
}

impl ProfileOps {
    /// Default ranges in the `boundscope` domain, labelled by symbol name.
    pub fn new() -> Self {
        Self::default()
    }

    /// Uses this range (domain, color, ...) for every op.
    pub fn with_range(mut self, range: NvtxRange) -> Self {
        self.range = range;
        self
    }

    /// Also attaches this range around every whole run.
    pub fn with_trace_range(mut self, range: NvtxRange) -> Self {
        self.trace_range = Some(range);
        self
    }
}

impl Pass for ProfileOps {
    fn name(&self) -> &str {
        "profile_ops"
    }

    fn run<'a>(&self, trace: &Trace<'a>, _arena: &'a Arena) -> Result<Trace<'a>> {
        let mut profiled = trace.clone();
        profiled.attach_guard(Selection::All, self.range.clone())?;
        if let Some(range) = &self.trace_range {
            profiled.attach_trace_guard(range.clone())?;
        }
        Ok(profiled)
    }
}
