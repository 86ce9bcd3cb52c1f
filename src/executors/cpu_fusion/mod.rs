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
use std::sync::{Arc, Mutex};

use crate::core::guards::DEFAULT_DOMAIN;
use crate::core::options::{Audience, OptionSpec, OptionType, OptionValue, Options};
use crate::core::plan::{EmittedRange, Executor, Fusible, Kernel, OpView};
use crate::error::{Error, Result};
use crate::executors::cpu_reference::builtin_fusible;

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
/// assert_eq!(out[0].to_f32_vec()[2], 9.0);
/// ```
#[derive(Clone, Debug)]
pub struct CpuFusion {
    block: usize,
    threads: usize,
    emit_ranges: bool,
    max_region_ops: usize,
    /// Where the programs of compiled regions go when dumping is on.
    dumps: Option<Arc<Mutex<Vec<String>>>>,
}

/// The options CpuFusion reads (all for its developers: the defaults are right for users).
pub const CPU_FUSION_OPTIONS: &[OptionSpec] = &[
    OptionSpec {
        name: "cpu_fusion.block_size",
        ty: OptionType::Int { min: 1, max: CpuFusion::MAX_BLOCK as i64 },
        default: OptionValue::Int(DEFAULT_BLOCK as i64),
        doc: "Elements per block; the temporaries of a region take block x 4 bytes each.",
        audience: Audience::Developer,
        env: None,
    },
    OptionSpec {
        name: "cpu_fusion.max_region_ops",
        ty: OptionType::Int { min: 1, max: 4096 },
        default: OptionValue::Int(4096),
        doc: "Largest number of ops fused into one region (the front end applies it to the CUDA fusion executor too).",
        audience: Audience::Developer,
        env: None,
    },
    OptionSpec {
        name: "cpu_fusion.dump_regions",
        ty: OptionType::Bool,
        default: OptionValue::Bool(false),
        doc: "Print each compiled region's program to stderr (and keep it: CpuFusion::dumped_regions).",
        audience: Audience::Developer,
        env: None,
    },
];

/// Elements per block by default: 4 KiB of `f32` per temporary, so that a region's
/// temporaries stay in L1/L2.
pub const DEFAULT_BLOCK: usize = 1024;

/// It pushes its region ranges in the library's domain.
static EMITS: [EmittedRange; 1] = [EmittedRange::nvtx_regions(DEFAULT_DOMAIN)];

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
        Self { block: DEFAULT_BLOCK, threads: 0, emit_ranges: true, max_region_ops: 4096, dumps: None }
    }

    /// Configured from options (`cpu_fusion.*`).
    ///
    /// ```
    /// use boundscope::executors::CpuFusion;
    /// use boundscope::options::Options;
    /// let mut options = Options::new();
    /// options.set_developer("cpu_fusion.max_region_ops", 3).unwrap();
    /// assert_eq!(CpuFusion::from_options(&options).unwrap().max_region_ops(), 3);
    /// ```
    ///
    /// # Errors
    /// [`Error::UnknownOption`] if `options` lacks CpuFusion's specs.
    pub fn from_options(options: &Options) -> Result<Self> {
        let mut fusion = Self::new().block_size(options.int("cpu_fusion.block_size")? as usize);
        fusion.max_region_ops = options.int("cpu_fusion.max_region_ops")? as usize;
        if options.bool("cpu_fusion.dump_regions")? {
            fusion.dumps = Some(Arc::default());
        }
        Ok(fusion)
    }

    /// The largest region the fusion pass should make for it.
    pub fn max_region_ops(&self) -> usize {
        self.max_region_ops
    }

    /// The programs of the regions compiled so far, when `cpu_fusion.dump_regions` is on.
    pub fn dumped_regions(&self) -> Vec<String> {
        self.dumps.as_ref().map(|d| d.lock().unwrap_or_else(|p| p.into_inner()).clone()).unwrap_or_default()
    }

    /// A shared handle with the defaults.
    pub fn shared() -> Arc<dyn Executor> {
        Arc::new(Self::new())
    }

    /// The largest block: 2^22 elements (16 MiB per temporary).
    pub const MAX_BLOCK: usize = 1 << 22;

    /// Processes `elements` elements per block, at least 1 and at most
    /// [`MAX_BLOCK`](Self::MAX_BLOCK): any other value is clamped to that range (a block is a
    /// size of temporaries, and any size computes the same results).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use boundscope::executors::{CpuFusion, CpuReference};
    /// use boundscope::passes::{FuseRegions, Pass};
    /// use boundscope::{Arena, Plan, Registry, Tensor, TraceBuilder};
    /// let (registry, arena) = (Registry::with_builtins(), Arena::new());
    /// let mut b = TraceBuilder::new(&arena, &registry);
    /// let x = b.input(&[5]).unwrap();
    /// let y = b.exp(x).unwrap();
    /// let z = b.neg(y).unwrap();
    /// b.output(z).unwrap();
    /// let trace = b.finish().unwrap();
    /// for block in [0, 2, usize::MAX] {
    ///     // Blocks of 1, 2 and MAX_BLOCK elements.
    ///     let fusion = Arc::new(CpuFusion::new().block_size(block));
    ///     let fused = FuseRegions::new(fusion.clone()).run(&trace, &arena).unwrap();
    ///     let plan = Plan::compile(&fused, &[fusion, CpuReference::shared()]).unwrap();
    ///     assert_eq!(plan.run(&[&Tensor::zeros(&[5])]).unwrap()[0].to_f32_vec(), &[-1.0; 5]);
    /// }
    /// ```
    pub fn block_size(mut self, elements: usize) -> Self {
        self.block = elements.clamp(1, Self::MAX_BLOCK);
        self
    }

    /// Splits large regions over at most `threads` threads, the calling one included: 0 (the
    /// default) means every core, 1 keeps every region on the calling thread. A region is split
    /// at block boundaries (at row boundaries when it reduces rows or reads per row) into one
    /// part per thread, once it has at least 2^16 elements per part (2^13 when it computes
    /// `exp`, `log`, `tanh`, `sigmoid` or `gelu`); the parts run on worker
    /// threads named `boundscope-cpu-<k>` (in Nsight too), each on its own scratch. The region's
    /// NVTX range and guards stay on the calling thread, around the whole region, and results do
    /// not depend on the split.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use boundscope::executors::{CpuFusion, CpuReference};
    /// use boundscope::passes::{FuseRegions, Pass};
    /// use boundscope::{Arena, Plan, Registry, Tensor, TraceBuilder};
    /// let (registry, arena) = (Registry::with_builtins(), Arena::new());
    /// let mut b = TraceBuilder::new(&arena, &registry);
    /// let x = b.input(&[1 << 18]).unwrap();
    /// let y = b.sigmoid(x).unwrap();
    /// let z = b.mul(x, y).unwrap();
    /// b.output(z).unwrap();
    /// let trace = b.finish().unwrap();
    /// let x = Tensor::from_fn(&[1 << 18], |i| (i % 9) as f32 - 4.0);
    /// let mut results = Vec::new();
    /// for threads in [1, 0] {
    ///     let fusion = Arc::new(CpuFusion::new().threads(threads));
    ///     let fused = FuseRegions::new(fusion.clone()).run(&trace, &arena).unwrap();
    ///     let plan = Plan::compile(&fused, &[fusion, CpuReference::shared()]).unwrap();
    ///     results.push(plan.run(&[&x]).unwrap().remove(0));
    /// }
    /// assert_eq!(results[0].to_f32_vec(), results[1].to_f32_vec());
    /// ```
    pub fn threads(mut self, threads: usize) -> Self {
        self.threads = threads;
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
        op.is_region_of(self)
    }

    fn compile(&self, op: &OpView<'_>) -> Result<Box<dyn Kernel>> {
        let range = match (self.emit_ranges, op.region_range()) {
            (true, Some(range)) => Some(range.prepare()?),
            _ => None,
        };
        let region = FusedRegion::compile(op, self.block, self.threads, range).map_err(|detail| {
            Error::KernelPrecondition { executor: Self::NAME.into(), symbol: op.name().into(), detail }
        })?;
        if let Some(dumps) = &self.dumps {
            let program = format!("{}:\n{region}", op.name());
            eprintln!("{program}");
            dumps.lock().unwrap_or_else(|p| p.into_inner()).push(program);
        }
        // Temporaries stay f32; only the region's outputs are rounded to their dtypes.
        Ok(crate::executors::cpu_reference::in_f32::InF32::wrap(Box::new(region), op))
    }

    /// Every float dtype: a region computes in `f32` throughout, keeping its temporaries in
    /// `f32` (not rounded to their ops' dtypes), and rounds only its outputs, once.
    fn dtypes(&self) -> &[crate::DType] {
        &crate::DType::FLOATS
    }

    fn emits(&self) -> &[EmittedRange] {
        if self.emit_ranges {
            &EMITS
        } else {
            &[]
        }
    }

    fn fusible(&self, op: &OpView<'_>) -> Fusible {
        builtin_fusible(op)
    }

    fn fusion_prefix(&self) -> &str {
        "Cpu"
    }

    fn options(&self) -> &[OptionSpec] {
        CPU_FUSION_OPTIONS
    }

    fn configured_options(&self) -> Vec<(&'static str, OptionValue)> {
        vec![
            ("cpu_fusion.block_size", OptionValue::Int(i64::try_from(self.block).unwrap_or(i64::MAX))),
            ("cpu_fusion.max_region_ops", OptionValue::Int(i64::try_from(self.max_region_ops).unwrap_or(i64::MAX))),
            ("cpu_fusion.dump_regions", OptionValue::Bool(self.dumps.is_some())),
        ]
    }
}

thread_local! {
    /// Block-sized temporaries, reused by every region run on this thread.
    static SCRATCH: RefCell<Vec<Vec<f32>>> = const { RefCell::new(Vec::new()) };
}

/// Bytes of fusion scratch held by the current thread: the extra memory fused regions need,
/// one block of `f32` (plus an 80-byte stagger) per temporary of the largest region this thread
/// has run, whatever the tensor size (rows longer than a block run in tiles). The thread keeps
/// it for the next region it runs. A region split over several threads uses this much on each
/// of them.
pub fn scratch_bytes() -> usize {
    SCRATCH.with(|s| s.borrow().iter().map(|t| t.capacity() * 4).sum())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::ir::{Arena, Registry, TraceBuilder};
    use crate::core::passes::{FuseRegions, Pass};
    use crate::core::plan::Plan;
    use crate::core::tensor::Tensor;
    use crate::executors::CpuReference;

    #[test]
    fn long_rows_run_in_tiles_with_block_sized_scratch() {
        let (arena, registry) = (Arena::new(), Registry::with_builtins());
        let mut b = TraceBuilder::new(&arena, &registry);
        let x = b.input(&[2, 1 << 20]).unwrap();
        let w = b.input(&[1 << 20]).unwrap();
        let e = b.exp(x).unwrap();
        let n = b.neg(e).unwrap();
        let m = b.mul(n, w).unwrap();
        let s = b.sum(m).unwrap();
        b.output(s).unwrap();
        let trace = b.finish().unwrap();
        let fused = FuseRegions::new(CpuFusion::shared()).run(&trace, &arena).unwrap();
        assert_eq!(fused.len(), 1, "{fused}");
        let plan = Plan::compile(&fused, &[CpuFusion::shared(), CpuReference::shared()]).unwrap();
        let reference = Plan::compile(&trace, &[CpuReference::shared()]).unwrap();
        let inputs = [
            Tensor::from_fn(&[2, 1 << 20], |i| (i % 13) as f32 / 13.0),
            Tensor::from_fn(&[1 << 20], |i| (i % 3) as f32),
        ];
        // On a thread of its own, so that the scratch measured is this region's.
        let (got, scratch) = std::thread::scope(|scope| {
            scope.spawn(|| (plan.run(&[&inputs[0], &inputs[1]]).unwrap(), scratch_bytes())).join().unwrap()
        });
        let expected = reference.run(&[&inputs[0], &inputs[1]]).unwrap();
        assert_eq!(got, expected, "tiles accumulate in the reference's order");
        // A few block-sized temporaries (plus their stagger), not rows of 2^20 elements.
        assert!(scratch <= 4 * (DEFAULT_BLOCK + 64) * 4, "{scratch} bytes of scratch");
    }

    /// A region's temporaries are written again once their value is read for the last time: a
    /// chain of 1,000 ops keeps two blocks of scratch for the chain (it kept one per op), with
    /// the reference's results, and a third for a value read again at its end.
    #[test]
    fn a_long_chain_reuses_its_temporaries() {
        let (arena, registry) = (Arena::new(), Registry::with_builtins());
        let mut b = TraceBuilder::new(&arena, &registry);
        let x = b.input(&[4, 1000]).unwrap();
        let first = b.tanh(x).unwrap();
        let mut y = first;
        for i in 0..1000 {
            y = if i % 2 == 0 { b.tanh(y).unwrap() } else { b.mul_scalar(y, 1.5).unwrap() };
        }
        let y = b.add(y, first).unwrap();
        b.output(y).unwrap();
        let trace = b.finish().unwrap();
        let fused = FuseRegions::new(CpuFusion::shared()).run(&trace, &arena).unwrap();
        assert_eq!(fused.len(), 1, "{fused}");
        let plan = Plan::compile(&fused, &[CpuFusion::shared()]).unwrap();
        let reference = Plan::compile(&trace, &[CpuReference::shared()]).unwrap();
        let input = Tensor::from_fn(&[4, 1000], |i| (i % 17) as f32 / 17.0 - 0.5);
        let (got, scratch) =
            std::thread::scope(|scope| scope.spawn(|| (plan.run(&[&input]).unwrap(), scratch_bytes())).join().unwrap());
        assert_eq!(got, reference.run(&[&input]).unwrap());
        // `first`, read at the end, and two for the chain.
        assert!(scratch <= 3 * (DEFAULT_BLOCK + 64) * 4, "{scratch} bytes of scratch");
    }

    #[test]
    fn a_region_run_outside_a_plan_with_wrong_buffers_is_a_typed_error() {
        use crate::core::plan::{Executor, OpView};
        use crate::core::tensor::{TensorMut, TensorRef};
        let (arena, registry) = (Arena::new(), Registry::with_builtins());
        let mut b = TraceBuilder::new(&arena, &registry);
        let x = b.input(&[8]).unwrap();
        let e = b.exp(x).unwrap();
        let y = b.neg(e).unwrap();
        b.output(y).unwrap();
        let fused = FuseRegions::new(CpuFusion::shared()).run(&b.finish().unwrap(), &arena).unwrap();
        let kernel = CpuFusion::new().compile(&OpView::of(&fused, 0).unwrap()).unwrap();
        let (input, mut out) = ([1.0f32; 8], [0.0f32; 4]);
        let short = kernel.run(
            &[TensorRef { shape: &[8], data: crate::Data::F32(&input) }],
            &mut [TensorMut { shape: &[4], data: crate::DataMut::F32(&mut out) }],
        );
        assert!(matches!(short, Err(Error::Execution { .. })), "{short:?}");
        assert!(kernel.run(&[], &mut []).is_err());
        let mut out = [0.0f32; 8];
        kernel
            .run(
                &[TensorRef { shape: &[8], data: crate::Data::F32(&input) }],
                &mut [TensorMut { shape: &[8], data: crate::DataMut::F32(&mut out) }],
            )
            .unwrap();
        assert_eq!(out[0], -(1.0f32.exp()));
    }

    #[test]
    fn nan_in_a_tiled_row_reaches_its_max() {
        let (arena, registry) = (Arena::new(), Registry::with_builtins());
        let mut b = TraceBuilder::new(&arena, &registry);
        let x = b.input(&[2, 64]).unwrap();
        let n = b.neg(x).unwrap();
        let m = b.max(n).unwrap();
        b.output(m).unwrap();
        let trace = b.finish().unwrap();
        let input = Tensor::from_fn(&[2, 64], |i| if i == 37 { f32::NAN } else { i as f32 });
        for block in [16, 4096] {
            let fusion = Arc::new(CpuFusion::new().block_size(block));
            let fused = FuseRegions::new(fusion.clone()).run(&trace, &arena).unwrap();
            let plan = Plan::compile(&fused, &[fusion, CpuReference::shared()]).unwrap();
            let out = plan.run(&[&input]).unwrap();
            assert!(out[0].to_f32_vec()[0].is_nan(), "block {block}: {:?}", out[0].to_f32_vec());
            assert_eq!(out[0].to_f32_vec()[1], -64.0, "block {block}");
        }
    }

    #[test]
    fn any_block_size_runs_like_the_reference() {
        let (arena, registry) = (Arena::new(), Registry::with_builtins());
        let mut b = TraceBuilder::new(&arena, &registry);
        let x = b.input(&[3, 5]).unwrap();
        let a = b.add_scalar(x, 1.0).unwrap();
        let m = b.mul(a, x).unwrap();
        let s = b.sum(m).unwrap();
        b.output(m).unwrap();
        b.output(s).unwrap();
        let trace = b.finish().unwrap();
        let reference = Plan::compile(&trace, &[CpuReference::shared()]).unwrap();
        let input = Tensor::from_fn(&[3, 5], |i| i as f32 - 7.0);
        let expected = reference.run(&[&input]).unwrap();
        for block in [0, 1, 7, 1 << 40, usize::MAX] {
            let fusion = Arc::new(CpuFusion::new().block_size(block));
            let fused = FuseRegions::new(fusion.clone()).run(&trace, &arena).unwrap();
            let plan = Plan::compile(&fused, &[fusion, CpuReference::shared()]).unwrap();
            assert_eq!(plan.run(&[&input]).unwrap(), expected, "block size {block}");
        }
    }

    #[test]
    fn a_reduction_over_empty_rows_gives_the_identity_like_the_reference() {
        let (arena, registry) = (Arena::new(), Registry::with_builtins());
        let mut b = TraceBuilder::new(&arena, &registry);
        let x = b.input(&[8, 0]).unwrap();
        let e = b.exp(x).unwrap();
        let m = b.max(e).unwrap();
        let s = b.sum(e).unwrap();
        b.output(m).unwrap();
        b.output(s).unwrap();
        let trace = b.finish().unwrap();
        let fused = FuseRegions::new(CpuFusion::shared()).run(&trace, &arena).unwrap();
        assert!(fused.to_string().contains("CpuFusion0"), "{fused}");
        let plan = Plan::compile(&fused, &[CpuFusion::shared(), CpuReference::shared()]).unwrap();
        let reference = Plan::compile(&trace, &[CpuReference::shared()]).unwrap();
        let input = Tensor::zeros(&[8, 0]);
        assert_eq!(plan.run(&[&input]).unwrap(), reference.run(&[&input]).unwrap());
        assert_eq!(reference.run(&[&input]).unwrap()[0].to_f32_vec(), &[f32::NEG_INFINITY; 8]);
    }
}
