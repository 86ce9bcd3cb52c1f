//! The CPU fusion executor: runs a region of elementwise ops (and an optional trailing
//! last-axis reduction) as one pass over the data, a block at a time.
//!
//! Each op of the region writes a block-sized temporary that the next ops read while it is
//! still in cache; only the region's outputs are written at full size. The extra memory of a
//! region is therefore `temporaries x block size`, whatever the tensor size. The executor emits
//! its own NVTX range per region (as nvFuser does), with the label the runtime would have
//! used, and declares it, so that the runtime does not emit a second one.

mod program;

use std::cell::RefCell;
use std::sync::Arc;

use crate::core::guards::{GuardKind, Level};
use crate::core::ir::prims;
use crate::core::plan::{EmittedRange, Executor, Fusible, Kernel, OpView};
use crate::error::{Error, Result};
use crate::executors::cpu_reference::builtin_prim;

pub use program::FusedRegion;

/// Fuses elementwise chains (optionally ending in a `sum` or `max` over the last axis) into
/// one blocked pass over the data. Claims the regions named `CpuFusion<N>` that
/// [`FuseRegions`](crate::passes::FuseRegions) made for it.
///
/// ```
/// use boundscope::executors::{CpuFusion, CpuReference};
/// use boundscope::passes::{FuseRegions, Pass};
/// use boundscope::{Arena, Plan, Registry, Tensor, TraceBuilder};
/// let registry = Registry::with_builtins();
/// let arena = Arena::new();
/// let mut b = TraceBuilder::new(&arena, &registry);
/// let a = b.input(&[8]).unwrap();
/// let x = b.add_scalar(a, 1.0).unwrap();
/// let y = b.mul(x, x).unwrap();
/// b.output(y).unwrap();
/// let trace = b.finish().unwrap();
/// let fused = FuseRegions::new(CpuFusion::shared()).run(&trace, &arena).unwrap();
/// let plan = Plan::compile(&fused, &[CpuFusion::shared(), CpuReference::shared()]).unwrap();
/// assert_eq!(plan.steps_per_executor(), vec![("cpu_fusion", 1)]);
/// let out = plan.run(&[&Tensor::from_fn(&[8], |i| i as f32)]).unwrap();
/// assert_eq!(out[0].data()[2], 9.0);
/// ```
#[derive(Clone, Copy, Debug)]
pub struct CpuFusion {
    block: usize,
    emit_ranges: bool,
}

/// Elements per block by default: 16 KiB of `f32` per temporary, so that a region's
/// temporaries stay in L1/L2.
pub const DEFAULT_BLOCK: usize = 4096;

const EMITS: [EmittedRange; 1] = [EmittedRange { kind: GuardKind::NvtxRange, level: Level::Region }];

impl Default for CpuFusion {
    fn default() -> Self {
        Self::new()
    }
}

impl CpuFusion {
    /// The executor's name.
    pub const NAME: &'static str = "cpu_fusion";

    /// Blocks of [`DEFAULT_BLOCK`] elements; emits an NVTX range per region.
    pub fn new() -> Self {
        Self { block: DEFAULT_BLOCK, emit_ranges: true }
    }

    /// A shared handle with the defaults.
    pub fn shared() -> Arc<dyn Executor> {
        Arc::new(Self::new())
    }

    /// Processes `elements` elements per block (at least 1).
    pub fn block_size(mut self, elements: usize) -> Self {
        self.block = elements.max(1);
        self
    }

    /// Whether it emits an NVTX range per region itself (default `true`). With `false` it
    /// declares nothing, and the runtime emits the region range instead: still exactly one.
    pub fn emit_region_ranges(mut self, emit: bool) -> Self {
        self.emit_ranges = emit;
        self
    }
}

impl Executor for CpuFusion {
    fn name(&self) -> &str {
        Self::NAME
    }

    fn claims(&self, op: &OpView<'_>) -> bool {
        op.is_region_of(self.fusion_prefix())
    }

    fn compile(&self, op: &OpView<'_>) -> Result<Box<dyn Kernel>> {
        let range = match (self.emit_ranges, op.region_range()) {
            (true, Some(range)) => Some(range.prepare(Self::NAME, None)?),
            _ => None,
        };
        let region = FusedRegion::compile(op, self.block, range).map_err(|message| Error::Execution {
            executor: Self::NAME.into(),
            symbol: op.name().into(),
            message,
        })?;
        Ok(Box::new(region))
    }

    fn emits(&self) -> &[EmittedRange] {
        if self.emit_ranges {
            &EMITS
        } else {
            &[]
        }
    }

    fn fusible(&self, op: &OpView<'_>) -> Fusible {
        match builtin_prim(op) {
            Some(id) if prims::UNARY.contains(&id) || prims::BINARY.contains(&id) => Fusible::Elementwise,
            Some(prims::SUM | prims::MAX) => Fusible::EndsRegion,
            _ => Fusible::No,
        }
    }

    fn fusion_prefix(&self) -> &str {
        "Cpu"
    }
}

thread_local! {
    /// Block-sized temporaries, reused by every region run on this thread.
    static SCRATCH: RefCell<Vec<Vec<f32>>> = const { RefCell::new(Vec::new()) };
}

/// Bytes of fusion scratch (block-sized temporaries) held by the current thread: the extra
/// memory fused regions need, whatever the tensor size.
pub fn scratch_bytes() -> usize {
    SCRATCH.with(|s| s.borrow().iter().map(|t| t.capacity() * 4).sum())
}
