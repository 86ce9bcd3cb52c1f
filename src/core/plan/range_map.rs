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
