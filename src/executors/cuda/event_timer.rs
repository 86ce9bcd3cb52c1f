//! `CudaEventTimer`: device time per op or region, from CUDA events recorded on the device's
//! stream around it, summarised per label like the host timer.
//!
//! Each site (an op or scope it is attached to) owns a ring of event pairs made when the plan
//! is compiled, so a run allocates nothing; sites of one label share their statistics. Elapsed
//! times are read lazily: when a site's pair comes round again (that site's entry from
//! `RING` entries before, long done), and in `stats()`, which waits for what was recorded.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cudarc::driver::{sys, CudaEvent};

use super::device::{cuda_error, CudaDevice};
use crate::core::guards::{Guard, GuardKind, GuardPolicy, GuardSite, ScopedGuard, TimerStats};
use crate::error::Result;

/// Event pairs per site: the entries of one site in flight before its oldest is read back (a
/// wait only if the device is that many runs of the plan behind the host).
const RING: usize = 4;

/// Device time of what it is attached to, per label (count, total, min, max), measured with
/// CUDA events on the device's stream. Clones share statistics.
///
/// One timer reads each site's events back in entry order, so use it from one thread at a time
/// (one plan run after another); from several threads at once its statistics may mix entries.
///
/// Attach it to ops or regions that run on the device. Around an op that runs on the host it
/// measures the time the stream saw between the two events, which, the device being idle, is
/// about the host op's time (with its transfers).
#[derive(Clone)]
pub struct CudaEventTimer {
    device: Arc<CudaDevice>,
    labels: Arc<Mutex<Table>>,
}

/// Per label: its statistics, and the sites that add to them.
type Labels = Vec<(String, Arc<Mutex<TimerStats>>, Vec<Arc<Site>>)>;

/// The labels, and how many sites they held after the last [`prune`] (dropped plans' sites are
/// freed once the count has doubled since, so that preparing stays linear in the sites).
#[derive(Default)]
struct Table {
    labels: Labels,
    sites: usize,
    pruned_at: usize,
}

struct Site {
    events: Vec<(CudaEvent, CudaEvent)>,
    /// Entries so far; entry `e` used pair `e % RING`.
    entries: AtomicU64,
    /// Entries whose time has been read back.
    read: Mutex<u64>,
    stats: Arc<Mutex<TimerStats>>,
}

impl CudaEventTimer {
    /// A timer on `device`'s stream.
    pub fn new(device: Arc<CudaDevice>) -> Self {
        Self { device, labels: Arc::default() }
    }

    /// Statistics per label (waits for the device work recorded so far), in the order labels
    /// were first prepared; labels that never ran are left out.
    pub fn stats(&self) -> Vec<TimerStats> {
        let mut table = self.labels.lock().unwrap_or_else(|p| p.into_inner());
        prune(&mut table);
        table
            .labels
            .iter()
            .filter_map(|(_, stats, sites)| {
                for site in sites {
                    site.read_back(site.entries.load(Ordering::Acquire));
                }
                Some(stats.lock().unwrap_or_else(|p| p.into_inner()).clone()).filter(|s| s.count > 0)
            })
            .collect()
    }
}

/// Frees the sites whose plans were dropped (the timer holds their last reference), their
/// times added to their labels first.
fn prune(table: &mut Table) {
    table.sites = 0;
    for (_, _, sites) in table.labels.iter_mut() {
        sites.retain(|site| {
            let alive = Arc::strong_count(site) > 1;
            if !alive {
                site.read_back(site.entries.load(Ordering::Acquire));
            }
            alive
        });
        table.sites += sites.len();
    }
}

impl Site {
    /// Reads back every entry before `upto` that has not been read.
    fn read_back(&self, upto: u64) {
        let mut read = self.read.lock().unwrap_or_else(|p| p.into_inner());
        while *read < upto {
            let (start, end) = &self.events[(*read % RING as u64) as usize];
            // A failed read leaves the statistics as they are; the next call that returns a
            // Result (a plan run) reports the device error.
            if end.synchronize().is_ok() {
                if let Ok(ms) = start.elapsed_ms(end) {
                    self.add(Duration::from_secs_f64(ms as f64 / 1e3));
                }
            }
            *read += 1;
        }
    }

    fn add(&self, elapsed: Duration) {
        let mut s = self.stats.lock().unwrap_or_else(|p| p.into_inner());
        s.count += 1;
        s.total += elapsed;
        s.min = s.min.min(elapsed);
        s.max = s.max.max(elapsed);
    }
}

struct PreparedEvents {
    site: Arc<Site>,
    /// Events are recorded on the stream of the run in progress (the workspace's queue).
    device: Arc<CudaDevice>,
}

impl ScopedGuard for PreparedEvents {
    fn on_enter(&self) -> u64 {
        let entry = self.site.entries.fetch_add(1, Ordering::AcqRel);
        // The pair comes round again: read the entry that used it first.
        self.site.read_back((entry + 1).saturating_sub(RING as u64));
        let (start, _) = &self.site.events[(entry % RING as u64) as usize];
        let _ = start.record(&self.device.stream());
        entry
    }

    fn on_exit(&self, entered: u64) {
        let (_, end) = &self.site.events[(entered % RING as u64) as usize];
        let _ = end.record(&self.device.stream());
    }
}

impl Guard for CudaEventTimer {
    /// The backward of what it surrounds is timed too, labelled `<label> (backward)`.
    fn on_backward(&self, forward_label: &str, _forward_position: Option<usize>) -> crate::core::guards::OnBackward {
        crate::core::guards::OnBackward::Relabeled(crate::core::guards::backward_label(forward_label))
    }

    fn kind(&self) -> GuardKind {
        GuardKind::Custom("@cuda_events")
    }

    fn policy(&self) -> GuardPolicy {
        GuardPolicy::MoveToEnclosing
    }

    fn merge_key(&self) -> Option<String> {
        Some(format!("cuda_events:{:p}", Arc::as_ptr(&self.labels)))
    }

    fn prepare(&self, site: &GuardSite<'_>) -> Result<Box<dyn ScopedGuard>> {
        let context = self.device.context().clone();
        let flags = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        let mut events = Vec::with_capacity(RING);
        for _ in 0..RING {
            let start = context.new_event(flags).map_err(|e| cuda_error("event", e))?;
            let end = context.new_event(flags).map_err(|e| cuda_error("event", e))?;
            events.push((start, end));
        }
        let mut table = self.labels.lock().unwrap_or_else(|p| p.into_inner());
        if table.sites >= 2 * table.pruned_at.max(64) {
            prune(&mut table);
            table.pruned_at = table.sites;
        }
        table.sites += 1;
        let labels = &mut table.labels;
        let index = match labels.iter().position(|(l, _, _)| l == site.label) {
            Some(i) => i,
            None => {
                let stats = TimerStats {
                    label: site.label.to_string(),
                    count: 0,
                    total: Duration::ZERO,
                    min: Duration::MAX,
                    max: Duration::ZERO,
                };
                labels.push((site.label.to_string(), Arc::new(Mutex::new(stats)), Vec::new()));
                labels.len() - 1
            }
        };
        let (_, stats, sites) = &mut labels[index];
        let ring = Arc::new(Site { events, entries: AtomicU64::new(0), read: Mutex::new(0), stats: stats.clone() });
        sites.push(ring.clone());
        Ok(Box::new(PreparedEvents { site: ring, device: self.device.clone() }))
    }
}
