//! `ScopeDetails`: what a guard's scope surrounds, computed when the plan is compiled.

use std::fmt;

use crate::core::ir::TensorMeta;

/// What one scope of a plan surrounds: the tensors it reads and writes, their bytes, an
/// estimate of its floating-point operations, and where it sits in the plan. A plan computes
/// it once per scope when it is compiled and hands it to every guard it prepares there
/// ([`GuardSite::details`](super::GuardSite::details)); [`NvtxRange`](super::NvtxRange) sends
/// it to the profiler as a structured payload.
///
/// - **Inputs** are the tensors the scope reads that it does not compute itself; **outputs**
///   are the tensors it computes that are read after it (or returned). A region's are the
///   region's; a whole run's are the trace's.
/// - **Bytes** count each distinct input or output tensor once: elements × dtype size.
/// - **FLOPs** are an estimate from each op's [`Category`](crate::Category): `2·m·n·k` for a
///   matmul, one per output element for an elementwise op, one per input element for a
///   reduction, none for a shape op; a composite or region counts its subsymbols, or one per
///   output element when it has none. Users' symbols are counted by their category too.
///
/// ```
/// use boundscope::guards::ScopeDetails;
/// use boundscope::TensorMeta;
/// let d = ScopeDetails {
///     plan: 1,
///     first_step: 0,
///     steps: 1,
///     ops: 1,
///     inputs: vec![TensorMeta::f32(&[64, 256]), TensorMeta::f32(&[256, 128])],
///     outputs: vec![TensorMeta::f32(&[64, 128])],
///     bytes_read: 4 * (64 * 256 + 256 * 128),
///     bytes_written: 4 * 64 * 128,
///     flops: 2 * 64 * 128 * 256,
/// };
/// assert_eq!(d.inputs_text(), "f32[64, 256], f32[256, 128]");
/// assert_eq!(d.to_string(), "f32[64, 256], f32[256, 128] -> f32[64, 128]; 192.0 KiB read, 32.0 KiB written, 4.19 MFLOP");
/// ```
///
/// Every guard, yours included, gets the same details when a plan prepares it
/// ([`GuardSite::details`](super::GuardSite::details));
/// [`NvtxRange::payload`](super::NvtxRange::payload) and
/// [`NvtxRange::details`](super::NvtxRange::details)`(false)` override them for a range. Where
/// the profiler takes NVTX payload schemas, each range carries them as its structured payload,
/// built when the plan is compiled, so entering a range is still one `nvtxDomainRangePushEx`;
/// elsewhere (no tool; Nsight Systems 2022.4) ranges carry their `u64` op count, and
/// [`Plan::range_map`](crate::Plan::range_map) says which. The test suite's NVTX capture
/// decodes every payload with its schema, and `proptests/range_map_matches_profiler.rs` checks
/// the fields against the range map.
///
/// ```
/// use boundscope::executors::CpuReference;
/// use boundscope::guards::{ClosureGuard, Guard, GuardKind, GuardSite, ScopedGuard, Selection};
/// use boundscope::{Arena, Plan, Registry, TraceBuilder};
/// use std::sync::{Arc, Mutex};
///
/// /// A user's guard that logs what each scope computes, once, when the plan is compiled.
/// struct LogsShapes(Arc<Mutex<Vec<String>>>);
/// impl Guard for LogsShapes {
///     fn kind(&self) -> GuardKind { GuardKind::Custom("@shapes") }
///     fn prepare(&self, site: &GuardSite<'_>) -> boundscope::Result<Box<dyn ScopedGuard>> {
///         let d = site.details.expect("a plan gives every site its details");
///         self.0.lock().unwrap().push(format!("{}: {} flops", site.label, d.flops));
///         ClosureGuard::new(|| {}, || {}).prepare(site)
///     }
/// }
///
/// let registry = Registry::with_builtins();
/// let arena = Arena::new();
/// let mut b = TraceBuilder::new(&arena, &registry);
/// let x = b.input(&[64, 256])?;
/// let w = b.input(&[256, 128])?;
/// let y = b.matmul(x, w)?;
/// b.output(y)?;
/// let mut trace = b.finish()?;
/// let log = Arc::new(Mutex::new(Vec::new()));
/// trace.attach_guard(Selection::All, LogsShapes(log.clone()))?;
/// Plan::compile(&trace, &[CpuReference::shared()])?;
/// assert_eq!(*log.lock().unwrap(), ["matmul: 4194304 flops"]);
/// # Ok::<(), boundscope::Error>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScopeDetails {
    /// The plan's id ([`Plan::id`](crate::Plan::id)).
    pub plan: u64,
    /// The first compiled step the scope surrounds (see the plan's listing).
    pub first_step: u32,
    /// How many compiled steps it surrounds.
    pub steps: u32,
    /// How many ops it surrounds: the prims a composite became, the ops a region fused.
    pub ops: u32,
    /// Dtypes and shapes of the tensors it reads, in order of first use.
    pub inputs: Vec<TensorMeta>,
    /// Dtypes and shapes of the tensors it writes that are used after it.
    pub outputs: Vec<TensorMeta>,
    /// Bytes of its inputs.
    pub bytes_read: u64,
    /// Bytes of its outputs.
    pub bytes_written: u64,
    /// An estimate of its floating-point operations.
    pub flops: u64,
}

impl ScopeDetails {
    /// The inputs as `f32[64, 256], f32[256]`.
    pub fn inputs_text(&self) -> String {
        list(&self.inputs)
    }

    /// The outputs as `f32[64, 256]`.
    pub fn outputs_text(&self) -> String {
        list(&self.outputs)
    }
}

fn list(tensors: &[TensorMeta]) -> String {
    tensors.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
}

impl fmt::Display for ScopeDetails {
    /// `inputs -> outputs; bytes read, bytes written, FLOPs`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} -> {}; {} read, {} written, {}",
            self.inputs_text(),
            self.outputs_text(),
            Bytes(self.bytes_read),
            Bytes(self.bytes_written),
            Flops(self.flops)
        )
    }
}

struct Bytes(u64);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
        let mut value = self.0 as f64;
        let mut unit = 0;
        while value >= 1024.0 && unit + 1 < UNITS.len() {
            value /= 1024.0;
            unit += 1;
        }
        match unit {
            0 => write!(f, "{} B", self.0),
            _ => write!(f, "{value:.1} {}", UNITS[unit]),
        }
    }
}

struct Flops(u64);

impl fmt::Display for Flops {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [&str; 6] = ["", "k", "M", "G", "T", "P"];
        let mut value = self.0 as f64;
        let mut unit = 0;
        while value >= 1000.0 && unit + 1 < UNITS.len() {
            value /= 1000.0;
            unit += 1;
        }
        match unit {
            0 => write!(f, "{} FLOP", self.0),
            _ => write!(f, "{value:.2} {}FLOP", UNITS[unit]),
        }
    }
}
