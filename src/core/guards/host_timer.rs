//! `HostTimer`: per-label count, total, min and max of host time.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{Guard, GuardKind, GuardPolicy, GuardSite, ScopedGuard};
use crate::error::Result;

/// Host-time statistics of one label.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TimerStats {
    /// The label.
    pub label: String,
    /// How many times it ran.
    pub count: u64,
    /// Total time.
    pub total: Duration,
    /// Shortest time.
    pub min: Duration,
    /// Longest time.
    pub max: Duration,
}

impl TimerStats {
    /// Mean time per run, rounded down to the nanosecond (zero if it never ran). Exact for
    /// every count, 2^32 samples and more included.
    ///
    /// ```
    /// use std::time::Duration;
    /// use boundscope::guards::TimerStats;
    /// let total = Duration::from_nanos(7 << 32);
    /// let stats = TimerStats { label: "op".into(), count: 1 << 32, total, min: Duration::ZERO, max: total };
    /// assert_eq!(stats.mean(), Duration::from_nanos(7));
    /// ```
    pub fn mean(&self) -> Duration {
        if self.count == 0 {
            return Duration::ZERO;
        }
        let nanos = self.total.as_nanos() / u128::from(self.count);
        // At most `total`, so the whole seconds fit in a u64.
        Duration::new((nanos / 1_000_000_000) as u64, (nanos % 1_000_000_000) as u32)
    }
}

/// Times what it is attached to on the host, aggregated per label. Clones share statistics.
///
/// ```
/// use boundscope::guards::{HostTimer, Selection};
/// use boundscope::{executors::CpuReference, Arena, Plan, Registry, Tensor, TraceBuilder};
/// let registry = Registry::with_builtins();
/// let arena = Arena::new();
/// let mut b = TraceBuilder::new(&arena, &registry);
/// let x = b.input(&[64, 64]).unwrap();
/// let y = b.matmul(x, x).unwrap();
/// b.output(y).unwrap();
/// let mut trace = b.finish().unwrap();
/// let timer = HostTimer::new();
/// trace.attach_guard(Selection::Named("matmul"), timer.clone()).unwrap();
/// let plan = Plan::compile(&trace, &[CpuReference::shared()]).unwrap();
/// for _ in 0..3 {
///     plan.run(&[&Tensor::zeros(&[64, 64])]).unwrap();
/// }
/// let stats = timer.stats();
/// assert_eq!(stats[0].label, "matmul");
/// assert_eq!(stats[0].count, 3);
/// assert!(stats[0].min <= stats[0].max);
/// ```
#[derive(Clone)]
pub struct HostTimer {
    inner: Arc<TimerInner>,
}

struct TimerInner {
    epoch: Instant,
    labels: Mutex<Vec<(Arc<str>, Arc<Counters>)>>,
}

struct Counters {
    count: AtomicU64,
    total_ns: AtomicU64,
    min_ns: AtomicU64,
    max_ns: AtomicU64,
}

impl Default for HostTimer {
    fn default() -> Self {
        Self::new()
    }
}

impl HostTimer {
    /// A timer with no statistics yet.
    pub fn new() -> Self {
        Self { inner: Arc::new(TimerInner { epoch: Instant::now(), labels: Mutex::new(Vec::new()) }) }
    }

    /// Statistics per label, in the order labels were first prepared; labels that never ran
    /// are left out.
    pub fn stats(&self) -> Vec<TimerStats> {
        let labels = self.inner.labels.lock().unwrap_or_else(|p| p.into_inner());
        labels
            .iter()
            .filter(|(_, c)| c.count.load(Ordering::Relaxed) > 0)
            .map(|(label, c)| TimerStats {
                label: label.to_string(),
                count: c.count.load(Ordering::Relaxed),
                total: Duration::from_nanos(c.total_ns.load(Ordering::Relaxed)),
                min: Duration::from_nanos(c.min_ns.load(Ordering::Relaxed)),
                max: Duration::from_nanos(c.max_ns.load(Ordering::Relaxed)),
            })
            .collect()
    }

    fn counters(&self, label: &str) -> Arc<Counters> {
        let mut labels = self.inner.labels.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, c)) = labels.iter().find(|(l, _)| l.as_ref() == label) {
            return c.clone();
        }
        let counters = Arc::new(Counters {
            count: AtomicU64::new(0),
            total_ns: AtomicU64::new(0),
            min_ns: AtomicU64::new(u64::MAX),
            max_ns: AtomicU64::new(0),
        });
        labels.push((Arc::from(label), counters.clone()));
        counters
    }
}

struct PreparedTimer {
    epoch: Instant,
    counters: Arc<Counters>,
}

impl ScopedGuard for PreparedTimer {
    fn on_enter(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    fn on_exit(&self, entered: u64) {
        let elapsed = (self.epoch.elapsed().as_nanos() as u64).saturating_sub(entered);
        let c = &self.counters;
        c.count.fetch_add(1, Ordering::Relaxed);
        c.total_ns.fetch_add(elapsed, Ordering::Relaxed);
        c.min_ns.fetch_min(elapsed, Ordering::Relaxed);
        c.max_ns.fetch_max(elapsed, Ordering::Relaxed);
    }
}

impl Guard for HostTimer {
    /// The backward of what it surrounds is recorded too, labelled `<label> (backward)`.
    fn on_backward(&self, forward_label: &str, _forward_position: Option<usize>) -> super::OnBackward {
        super::OnBackward::Relabeled(super::backward_label(forward_label))
    }

    fn kind(&self) -> GuardKind {
        GuardKind::HostTimer
    }

    /// A fused op's timer moves to (times) its region.
    fn policy(&self) -> GuardPolicy {
        GuardPolicy::MoveToEnclosing
    }

    fn merge_key(&self) -> Option<String> {
        Some(format!("timer:{:p}", Arc::as_ptr(&self.inner)))
    }

    fn prepare(&self, site: &GuardSite<'_>) -> Result<Box<dyn ScopedGuard>> {
        Ok(Box::new(PreparedTimer { epoch: self.inner.epoch, counters: self.counters(site.label) }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(count: u64, total: Duration) -> TimerStats {
        TimerStats { label: "op".into(), count, total, min: Duration::ZERO, max: total }
    }

    #[test]
    fn mean_is_right_at_and_past_two_to_the_32_samples() {
        assert_eq!(stats(0, Duration::ZERO).mean(), Duration::ZERO);
        assert_eq!(stats(4, Duration::from_nanos(10)).mean(), Duration::from_nanos(2));
        // 2^32 samples: `count as u32` was 0 (a division by zero).
        assert_eq!(stats(1 << 32, Duration::from_nanos(3 << 32)).mean(), Duration::from_nanos(3));
        // Past 2^32: `count as u32` was 1, so the mean was the total.
        let count = (1 << 32) + 1;
        assert_eq!(stats(count, Duration::from_nanos(5 * count)).mean(), Duration::from_nanos(5));
        // The largest values a `TimerStats` can hold.
        assert_eq!(stats(u64::MAX, Duration::MAX).mean(), Duration::from_secs(1));
        assert_eq!(stats(1, Duration::MAX).mean(), Duration::MAX);
    }
}
