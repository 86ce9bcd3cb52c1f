//! The range map: every NVTX range one run of a plan pushes, in order, and who pushes it.
//!
//! A plan prepares all its ranges when it is compiled, so it can say before it runs exactly
//! what a profiler will record. Tests and `scripts/nsys-check` compare what a profiler recorded
//! with this map.

use std::fmt;
use std::ops::Range;

use crate::core::guards::Level;

/// Who pushes a range.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum PushedBy {
    /// The plan's run loop.
    Runtime,
    /// The named executor, from inside its kernel (see [`EmittedRange`](crate::EmittedRange)).
    Executor(String),
}

impl fmt::Display for PushedBy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PushedBy::Runtime => f.write_str("runtime"),
            PushedBy::Executor(name) => f.write_str(name),
        }
    }
}

/// One NVTX range of a run, as the plan will push it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedRange {
    /// The steps it surrounds (see the plan's listing).
    pub steps: Range<usize>,
    /// Its level.
    pub level: Level,
    /// Its NVTX domain.
    pub domain: String,
    /// Its label.
    pub label: String,
    /// Its NVTX category, where the plan knows it (built-in ranges; `None` for a user's guard
    /// kind that reports a domain and builds its own attributes).
    pub category: Option<u32>,
    /// Its ARGB colour, where the plan knows it.
    pub color: Option<u32>,
    /// Its `u64` payload, where it has one and the plan knows it.
    pub payload: Option<u64>,
    /// Its structured payload, where it carries one (the profiler takes NVTX payload schemas;
    /// see [`NvtxRange`](crate::guards::NvtxRange)).
    pub details: Option<crate::guards::ScopeDetails>,
    /// Who pushes it.
    pub pushed_by: PushedBy,
}

/// Every NVTX range one run of a plan pushes, in push order (a range pushed later while an
/// earlier one is open nests inside it). See [`Plan::range_map`](crate::Plan::range_map).
///
/// # One range per scope per NVTX domain
/// A scope is what a guard surrounds in a plan: a run, a named scope, a region, an op, or a
/// subsymbol span. The plan enforces one rule, whoever attached the guards and however often:
///
/// | on one scope | what one run pushes |
/// | --- | --- |
/// | NVTX guards of one domain, attached any number of times (`ProfileOps` twice, the front end on a trace you already profiled) | one range in that domain; the first explicit label, colour, category and payload win, and a conflict is a note in the plan's header ([`Plan::notes`](crate::Plan::notes)) |
/// | a region whose executor pushes its own ranges, declared as [`EmittedRange::nvtx_regions(domain)`](crate::EmittedRange::nvtx_regions) | in that domain, exactly the executor's range (labelled by that domain's guards, else `<Executor>Fusion<N>: (op, ...)`), none from the runtime; in every other domain with NVTX guards on the region, one range from the runtime, labelled from that domain's guards only |
/// | one `Recorder`, `HostTimer`, `ClosureGuard` or guard of yours, attached twice | it runs once |
/// | a range that would sit directly inside one of its domain with its label | dropped, with a note |
///
/// A run keeps the profiling decision it started with
/// ([`Plan::set_profiling`](crate::Plan::set_profiling) during a run takes effect at the next
/// run), exits every guard it entered on every path (a guard exit that panics is resumed after
/// the others exit; during a kernel's panic it is discarded, and the process never aborts), and
/// region names stay unique across fusion passes. The plan says before it runs which ranges one
/// run pushes, in order, and who pushes them (this map, listed under the steps by `{plan:#}`);
/// the property tests and `scripts/nsys-check` compare what a profiler recorded with it.
///
/// ```
/// use std::sync::Arc;
/// use boundscope::executors::{CpuFusion, CpuReference};
/// use boundscope::guards::{NvtxRange, Selection};
/// use boundscope::passes::{FuseRegions, Pass, ProfileOps};
/// use boundscope::{Arena, EmittedRange, Plan, PushedBy, Registry, TraceBuilder};
///
/// let registry = Registry::with_builtins();
/// let arena = Arena::new();
/// let mut b = TraceBuilder::new(&arena, &registry);
/// let x = b.input(&[1024])?;
/// let e = b.exp(x)?;
/// let y = b.neg(e)?;
/// b.output(y)?;
/// let once = ProfileOps::new().run(&b.finish()?, &arena)?;
/// let twice = ProfileOps::new().run(&once, &arena)?;               // still one range per op
/// let mut fused = FuseRegions::new(CpuFusion::shared()).run(&twice, &arena)?;
/// fused.attach_guard(Selection::All, NvtxRange::new().domain("my_app")?.label("activation")?)?;
/// let plan = Plan::compile(&fused, &[CpuFusion::shared(), CpuReference::shared()])?;
/// print!("{plan:#}");
/// let ranges = plan.range_map().ranges();
/// assert_eq!(ranges.len(), 2);
/// assert_eq!((ranges[0].domain.as_str(), ranges[0].label.as_str()), ("my_app", "activation"));
/// assert_eq!(ranges[1].label, "CpuFusion0: (exp, neg)");            // the label is not renamed
/// assert_eq!(ranges[1].pushed_by, PushedBy::Executor("cpu_fusion".into()));
/// // What CpuFusion declares: it pushes its region ranges in the library's domain.
/// assert_eq!(CpuFusion::shared().emits(), &[EmittedRange::nvtx_regions("boundscope")]);
/// # Ok::<(), boundscope::Error>(())
/// ```
///
/// `examples/ranges_in_three_domains.rs` does this with a user's executor in its own domain, the
/// application's ranges in a third, and `ProfileOps` applied twice; CI checks it under Nsight
/// Systems against its range map.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RangeMap {
    pub(crate) ranges: Vec<PlannedRange>,
}

impl RangeMap {
    /// The ranges, in push order.
    pub fn ranges(&self) -> &[PlannedRange] {
        &self.ranges
    }

    /// Number of ranges one run pushes.
    pub fn len(&self) -> usize {
        self.ranges.len()
    }

    /// Whether a run pushes no range.
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// How many ranges one run pushes in `domain`.
    pub fn count_in(&self, domain: &str) -> usize {
        self.ranges.iter().filter(|r| r.domain == domain).count()
    }

    /// `(domain, label, count)` for `runs` runs, sorted by domain and label: what a profiler's
    /// summary per domain and label should show. Used by `scripts/nsys-check`.
    pub fn counts(&self, runs: usize) -> Vec<(String, String, usize)> {
        let mut counts: Vec<(String, String, usize)> = Vec::new();
        for r in &self.ranges {
            match counts.iter_mut().find(|(d, l, _)| *d == r.domain && *l == r.label) {
                Some(entry) => entry.2 += runs,
                None => counts.push((r.domain.clone(), r.label.clone(), runs)),
            }
        }
        counts.sort();
        counts
    }

    /// [`counts`](Self::counts) as tab-separated lines `domain<TAB>label<TAB>count`, the format
    /// `scripts/nsys-check` reads. Tabs and newlines in labels are written as spaces.
    pub fn counts_tsv(&self, runs: usize) -> String {
        let clean = |s: &str| s.replace(['\t', '\n', '\r'], " ");
        self.counts(runs).iter().map(|(d, l, n)| format!("{}\t{}\t{n}\n", clean(d), clean(l))).collect()
    }
}

impl fmt::Display for RangeMap {
    /// One line per range, indented by nesting: `domain  label  [level, steps a..b] by whom`,
    /// then its structured payload where it carries one.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "# ranges of one run: {}", self.ranges.len())?;
        let mut open: Vec<Range<usize>> = Vec::new();
        for r in &self.ranges {
            while open.last().is_some_and(|o| !(o.start <= r.steps.start && r.steps.end <= o.end)) {
                open.pop();
            }
            write!(
                f,
                "#   {:indent$}{} `{}`  [{}, steps {}..{}] pushed by {}",
                "",
                r.domain,
                r.label,
                r.level.name(),
                r.steps.start,
                r.steps.end,
                r.pushed_by,
                indent = 2 * open.len()
            )?;
            match &r.details {
                Some(details) => writeln!(f, "  payload: {details}")?,
                None => writeln!(f)?,
            }
            open.push(r.steps.clone());
        }
        Ok(())
    }
}
