//! Which NVTX ranges a plan prepares: by level, by executor and by symbol category.
//!
//! A filter is applied when the plan is compiled, not when it runs: a range it switches off is
//! never prepared, so it costs nothing per op, is absent from the range map, and no executor is
//! asked to push it (an executor that pushes its own region ranges gets no range to push for a
//! region the filter leaves out). The plan's notes list every level, executor or category of
//! the filter that matches no range of the plan, which is how a typo (`cpu_fuson`) or a level
//! the plan does not have (subsymbol ranges of composites an executor runs whole) shows. Set
//! through the options (`runtime.nvtx_executors`), an executor's name that neither the plan's
//! executors nor a built-in one has is an error ([`Plan::compile_with_options`]).
//!
//! [`Plan::compile_with_options`]: crate::Plan::compile_with_options

use crate::core::guards::Level;
use crate::core::ir::Category;
use crate::core::options::{OptionValue, Options};
use crate::error::{Error, Result};

/// Level names, outermost first (`runtime.nvtx_levels`).
pub(crate) const LEVEL_NAMES: &[&str] = &["trace", "scope", "region", "op", "subsymbol"];
/// Symbol category names (`runtime.nvtx_categories`).
pub(crate) const CATEGORY_NAMES: &[&str] =
    &["elementwise", "reduction", "matmul", "shape", "composite", "fusion", "collective"];
/// Built-in executor names, and `runtime` for scopes that several executors share
/// (`runtime.nvtx_executors`).
pub(crate) const EXECUTOR_NAMES: &[&str] =
    &["cpu_reference", "cpu_fusion", "cuda_ops", "cuda_fusion", "collectives", "nccl", "runtime"];

const CATEGORIES: [Category; 7] = [
    Category::Elementwise,
    Category::Reduction,
    Category::Matmul,
    Category::Shape,
    Category::Composite,
    Category::Fusion,
    Category::Collective,
];

/// Which NVTX ranges a plan prepares: every range of a chosen level, of a chosen executor and
/// of a chosen symbol category. The default admits every range.
///
/// - Levels: [`Level::Trace`] (the range around each run), [`Level::Scope`] (named scopes),
///   [`Level::Region`], [`Level::Op`], [`Level::Subsymbol`].
/// - Executors: the name of the executor that runs what the range surrounds (`runtime` for a
///   span that several executors share). Not applied to run and scope ranges.
/// - Categories: the [`Category`] of the symbol a range surrounds; a fused region matches when
///   one of its ops does (or when `Fusion` is chosen). Not applied to run and scope ranges.
///
/// Only ranges (guards that report an NVTX domain) are filtered: recorders, timers and guards of
/// yours run as attached.
///
/// ```
/// use boundscope::guards::Level;
/// use boundscope::passes::{Pass, ProfileOps};
/// use boundscope::guards::NvtxRange;
/// use boundscope::{executors::CpuReference, Arena, Category, Plan, RangeFilter, Registry, TraceBuilder};
/// let registry = Registry::with_builtins();
/// let arena = Arena::new();
/// let mut b = TraceBuilder::new(&arena, &registry);
/// let x = b.input(&[8, 8]).unwrap();
/// let e = b.exp(x).unwrap();
/// let y = b.matmul(e, x).unwrap();
/// b.output(y).unwrap();
/// let trace = ProfileOps::new().with_trace_range(NvtxRange::new().label("step").unwrap()).run(&b.finish().unwrap(), &arena).unwrap();
///
/// // Run and matmul ranges only: the exp range is never prepared.
/// let filter = RangeFilter::new().levels(&[Level::Trace, Level::Op]).categories(&[Category::Matmul]);
/// let plan = Plan::compile_filtered(&trace, &[CpuReference::shared()], &filter).unwrap();
/// let labels: Vec<&str> = plan.range_map().ranges().iter().map(|r| r.label.as_str()).collect();
/// assert_eq!(labels, ["step", "matmul"]);
///
/// // A filter that matches nothing in the plan says so in the plan's notes.
/// let typo = RangeFilter::new().executors(["cpu_refernce"]);
/// let plan = Plan::compile_filtered(&trace, &[CpuReference::shared()], &typo).unwrap();
/// assert!(plan.notes().iter().any(|n| n.contains("executor `cpu_refernce`")));
/// assert_eq!(plan.range_map().len(), 1); // the run's range only
/// ```
///
/// One known gap: a region that sits directly inside a composite's range of its own label (a
/// profiled `softmax` whose middle ops were fused) leaves that label to the composite's range;
/// when a filter by executor or category then drops the composite's range, the region's range
/// is pushed by the runtime rather than by the executor (still exactly one, and in the range
/// map). The same blindness the other way: where a filter by executor or category drops a
/// composite's range that stood between a range of the runtime's and a range an executor
/// pushes itself with the same label (a scope named `exp` around a `softmax` whose `exp` an
/// executor runs and profiles), the runtime's range is dropped, with a note in the plan, so
/// that no range sits directly inside its twin.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RangeFilter {
    levels: Vec<Level>,
    executors: Option<Vec<String>>,
    categories: Option<Vec<Category>>,
}

impl Default for RangeFilter {
    fn default() -> Self {
        Self::new()
    }
}

impl RangeFilter {
    /// Every range: all levels, executors and categories.
    pub fn new() -> Self {
        Self { levels: Level::ALL.to_vec(), executors: None, categories: None }
    }

    /// Only ranges of these levels (none at all for an empty list).
    pub fn levels(mut self, levels: &[Level]) -> Self {
        let mut chosen: Vec<Level> = Vec::new();
        for &level in levels {
            if !chosen.contains(&level) {
                chosen.push(level);
            }
        }
        self.levels = chosen;
        self
    }

    /// Only ranges around what these executors run (by [`Executor::name`](crate::Executor::name);
    /// `runtime` for spans that several executors share). Run ranges are not filtered by
    /// executor.
    pub fn executors<S: Into<String>>(mut self, names: impl IntoIterator<Item = S>) -> Self {
        let mut chosen: Vec<String> = Vec::new();
        for name in names {
            let name = name.into();
            if !chosen.contains(&name) {
                chosen.push(name);
            }
        }
        self.executors = Some(chosen);
        self
    }

    /// Only ranges around symbols of these categories (a region: one of its ops). Run ranges are
    /// not filtered by category.
    pub fn categories(mut self, categories: &[Category]) -> Self {
        let mut chosen: Vec<Category> = Vec::new();
        for &category in categories {
            if !chosen.contains(&category) {
                chosen.push(category);
            }
        }
        self.categories = Some(chosen);
        self
    }

    /// The filter that the options `runtime.nvtx_levels`, `runtime.nvtx_executors` and
    /// `runtime.nvtx_categories` describe (an empty list, their default, filters nothing; to
    /// switch every range off, set `runtime.profiling=off`).
    ///
    /// ```
    /// use boundscope::guards::Level;
    /// use boundscope::options::Options;
    /// use boundscope::RangeFilter;
    /// let mut options = Options::new();
    /// assert_eq!(RangeFilter::from_options(&options).unwrap(), RangeFilter::new());
    /// options.set_str("runtime.nvtx_levels", "trace,region").unwrap();
    /// options.set_str("runtime.nvtx_executors", "cpu_fusion").unwrap();
    /// let filter = RangeFilter::from_options(&options).unwrap();
    /// assert_eq!(filter, RangeFilter::new().levels(&[Level::Trace, Level::Region]).executors(["cpu_fusion"]));
    /// assert!(options.set_str("runtime.nvtx_levels", "ops").is_err()); // `op`, not `ops`
    /// ```
    ///
    /// It takes the executors' names as given: [`Plan::compile_with_options`] checks them
    /// against its executors' (and the built-in ones'), [`Plan::compile_filtered`] does not.
    ///
    /// # Errors
    /// [`Error::UnknownOption`] if `options` lacks the runtime's specs;
    /// [`Error::InvalidOptionValue`] if one of them is not a list.
    ///
    /// [`Plan::compile_with_options`]: crate::Plan::compile_with_options
    /// [`Plan::compile_filtered`]: crate::Plan::compile_filtered
    pub fn from_options(options: &Options) -> Result<Self> {
        let list = |name: &str| -> Result<Vec<&'static str>> {
            match options.get(name)? {
                OptionValue::EnumList(items) => Ok(items),
                other => Err(Error::InvalidOptionValue {
                    name: name.to_string(),
                    expected: "a list option".into(),
                    got: other.to_string(),
                }),
            }
        };
        let levels: Vec<Level> = list("runtime.nvtx_levels")?
            .iter()
            .filter_map(|name| Level::ALL.iter().copied().find(|l| l.name() == *name))
            .collect();
        let mut filter = Self::new();
        if !levels.is_empty() {
            filter = filter.levels(&levels);
        }
        let executors = match options.get("runtime.nvtx_executors")? {
            OptionValue::NameList(items) => items,
            other => {
                return Err(Error::InvalidOptionValue {
                    name: "runtime.nvtx_executors".into(),
                    expected: "a list of names".into(),
                    got: other.to_string(),
                })
            }
        };
        if !executors.is_empty() {
            filter = filter.executors(executors);
        }
        let categories: Vec<Category> = list("runtime.nvtx_categories")?
            .iter()
            .filter_map(|name| CATEGORIES.iter().copied().find(|c| c.to_string() == *name))
            .collect();
        if !categories.is_empty() {
            filter = filter.categories(&categories);
        }
        Ok(filter)
    }

    /// Checks that each executor the filter names is one of `executors`, a built-in one, or
    /// `runtime`: a filter set through the options (`runtime.nvtx_executors`,
    /// `BOUNDSCOPE_NVTX_EXECUTORS`), where a typo would leave a profile without the ranges
    /// asked for. (A filter made in code may name executors a plan lacks: several plans may
    /// share it; the plan's notes list such names.)
    ///
    /// # Errors
    /// [`Error::InvalidOptionValue`] naming the first unknown name and the known ones.
    pub(crate) fn check_named_executors_exist<'e>(
        &self,
        executors: impl Iterator<Item = &'e str> + Clone,
    ) -> Result<()> {
        let Some(unknown) =
            self.executors.iter().flatten().find(|name| {
                !EXECUTOR_NAMES.contains(&name.as_str()) && !executors.clone().any(|e| e == name.as_str())
            })
        else {
            return Ok(());
        };
        let mut known: Vec<&str> = executors.collect();
        known.extend(EXECUTOR_NAMES.iter().filter(|n| !known.contains(n)).collect::<Vec<_>>());
        let hint = crate::error::did_you_mean(unknown, known.iter().copied())
            .map_or_else(String::new, |near| format!("did you mean `{near}`? "));
        Err(Error::InvalidOptionValue {
            name: "runtime.nvtx_executors".into(),
            expected: format!(
                "{hint}names of this plan's executors or built-in ones: {} (the option `runtime.nvtx_executors`, or \
                 `BOUNDSCOPE_NVTX_EXECUTORS` in the front end)",
                known.join(", ")
            ),
            got: unknown.clone(),
        })
    }

    /// Whether it admits every range.
    pub fn admits_everything(&self) -> bool {
        self.levels.len() == Level::ALL.len() && self.executors.is_none() && self.categories.is_none()
    }

    /// Whether ranges of `level` are admitted at all.
    pub(crate) fn admits_level(&self, level: Level) -> bool {
        self.levels.contains(&level)
    }

    /// Whether a range at `level`, around what `executor` runs, over symbols of `categories`,
    /// is admitted.
    pub(crate) fn admits(&self, level: Level, executor: &str, categories: &[Category]) -> bool {
        if !self.admits_level(level) {
            return false;
        }
        if matches!(level, Level::Trace | Level::Scope) {
            return true;
        }
        let executor_ok = self.executors.as_ref().is_none_or(|names| names.iter().any(|n| n == executor));
        let category_ok = self.categories.as_ref().is_none_or(|chosen| categories.iter().any(|c| chosen.contains(c)));
        executor_ok && category_ok
    }

    /// Notes for the parts of the filter that match no range of the plan: `scopes` are the
    /// plan's scopes that carry NVTX guards, as `(level, executor, categories)`.
    pub(crate) fn unmatched_notes(&self, scopes: &[(Level, String, Vec<Category>)]) -> Vec<String> {
        if self.admits_everything() {
            return Vec::new();
        }
        let mut notes = Vec::new();
        // Levels are noted only when the filter chose some: all of them is no choice.
        let chosen_levels: &[Level] = if self.levels.len() == Level::ALL.len() { &[] } else { &self.levels };
        for &level in chosen_levels {
            if !scopes.iter().any(|(l, _, _)| *l == level) {
                notes.push(format!(
                    "NVTX filter: level `{}` matches no range of this plan (no NVTX guard surrounds a {} here)",
                    level.name(),
                    level.name()
                ));
            }
        }
        let below_run = |(l, _, _): &&(Level, String, Vec<Category>)| *l != Level::Trace;
        for name in self.executors.iter().flatten() {
            if !scopes.iter().filter(below_run).any(|(_, e, _)| e == name) {
                let known: Vec<&str> = {
                    let mut known: Vec<&str> = Vec::new();
                    for (_, e, _) in scopes.iter().filter(below_run) {
                        if !known.contains(&e.as_str()) {
                            known.push(e);
                        }
                    }
                    known
                };
                notes.push(format!(
                    "NVTX filter: executor `{name}` matches no range of this plan (ranges here surround what {} run{})",
                    if known.is_empty() { "no executor".to_string() } else { known.join(", ") },
                    if known.len() == 1 { "s" } else { "" }
                ));
            }
        }
        for category in self.categories.iter().flatten() {
            if !scopes.iter().filter(below_run).any(|(_, _, c)| c.contains(category)) {
                notes.push(format!("NVTX filter: category `{category}` matches no range of this plan"));
            }
        }
        notes
    }
}
