//! The CUDA executors: `CudaFusion` (one generated kernel per fused region, its own NVTX range
//! per region) and `CudaOps` (one generated kernel per elementwise prim, cuBLASLt for `matmul`
//! and `linear`).

use std::sync::{Arc, Mutex};

use std::ffi::c_void;

use cudarc::driver::{sys, CudaFunction, LaunchConfig};

use super::attention::{self, Attention};
use super::codegen::{op_source_for, region_source_for, RegionTarget};
use super::device::{address, cuda_error, CudaDevice};
use super::device_checks::BufferLengths;
use super::flash_attention::{flash_operands, FlashAttention};
use super::flash_attention_backward::{flash_backward_on, FlashAttentionBackward};
use super::gemm::{GemmShape, LtContext, LtGemm};
use super::layer_norm_backward;
use super::row_kernels::{row_source, RowTarget, MAX_CLUSTER_BLOCKS};
use super::{cross_entropy, gather, index_ops, multi_tensor};
use super::{shape_op_source, KernelVariants, RegionSource, CUDA_OPTIONS};
use crate::core::guards::DEFAULT_DOMAIN;
use crate::core::ir::prims;
use crate::core::plan::{
    Device, DeviceBuffer, DeviceKernel, EmittedRange, Executor, Fusible, OpView, PreparedRegionRange,
};
use crate::error::{Error, Result};
use crate::executors::cpu_reference::{builtin_fusible, builtin_prim, require_builtin};
use crate::options::{OptionSpec, OptionValue, Options};

const THREADS: u32 = super::codegen::BLOCK_THREADS;
/// It pushes its region ranges in the library's domain.
static EMITS: [EmittedRange; 1] = [EmittedRange::nvtx_regions(DEFAULT_DOMAIN)];

/// Runs the regions named `CudaFusion<N>` that
/// [`FuseRegions`](crate::passes::FuseRegions) made for it (elementwise chains, optionally
/// ending in a last-axis `sum` or `max`) as one generated kernel each, and pushes its own NVTX
/// range around each. It [joins](Executor::joins) independent elementwise regions (an
/// optimizer's updates of every parameter): a joined region runs its chains, each over its own
/// shape, in a few multi-tensor launches inside its one range.
pub struct CudaFusion {
    device: Arc<CudaDevice>,
    variants: KernelVariants,
}

impl CudaFusion {
    /// The executor's name.
    pub const NAME: &'static str = "cuda_fusion";

    /// On `device`, generating the default kernels.
    pub fn new(device: Arc<CudaDevice>) -> Self {
        Self { device, variants: KernelVariants::default() }
    }

    /// On `device`, generating the [`KernelVariants`] that `options` choose (`cuda.*`,
    /// developer options).
    ///
    /// # Errors
    /// As [`KernelVariants::from_options`].
    pub fn from_options(device: Arc<CudaDevice>, options: &Options) -> Result<Self> {
        Ok(Self::new(device).with_variants(KernelVariants::from_options(options)?))
    }

    /// The same executor, generating `variants` of its kernels (plans list those that are not
    /// the defaults in their header).
    pub fn with_variants(self, variants: KernelVariants) -> Self {
        Self { variants, ..self }
    }
}

impl Executor for CudaFusion {
    fn name(&self) -> &str {
        Self::NAME
    }

    fn claims(&self, op: &OpView<'_>) -> bool {
        op.is_region_of(self)
    }

    fn device(&self) -> Option<Arc<dyn Device>> {
        Some(self.device.clone())
    }

    fn compile_device(&self, op: &OpView<'_>) -> Result<Box<dyn DeviceKernel>> {
        let precondition =
            |detail| Error::KernelPrecondition { executor: Self::NAME.into(), symbol: op.name().into(), detail };
        let range = op.region_range().map(|r| r.prepare()).transpose()?;
        // A region joined from regions of several shapes (`joins`) runs chain by chain.
        if multi_tensor::is_joined(&op.region_ops()?) {
            let joined =
                multi_tensor::joined_source(op, &kernel_name(op.name()), self.variants).map_err(precondition)?;
            return Ok(Box::new(multi_tensor::JoinedKernel::new(&self.device, joined, range)?));
        }
        let name = kernel_name(op.name());
        let kernel = fitted_kernel(&self.device, self.variants, range, |variants, target| {
            region_source_for(op, &name, variants, target).map_err(precondition)
        })?;
        Ok(Box::new(kernel))
    }

    /// Regions of elementwise ops whose inputs are each of the region's shape or a single
    /// value, in float dtypes: a joined region runs as one launch per table of up to 4 KB of
    /// chains (an optimizer step over GPT-2's 148 parameters: a few launches, not 148).
    fn joins(&self, region: &OpView<'_>) -> bool {
        multi_tensor::joinable(region)
    }

    fn emits(&self) -> &[EmittedRange] {
        &EMITS
    }

    /// Every float dtype: a region reads 16-bit inputs and writes 16-bit outputs with 16-byte
    /// vector accesses and computes in `f32` registers, rounding only its outputs.
    fn dtypes(&self) -> &[crate::DType] {
        &crate::DType::FLOATS
    }

    /// The CPU executors' fusible ops, and casts between float dtypes (a cast to 16 bits
    /// inside a region rounds there, as it does alone).
    fn fusible(&self, op: &OpView<'_>) -> Fusible {
        if builtin_prim(op) == Some(prims::CAST) && op.dtypes().iter().all(|d| d.is_float()) {
            return Fusible::Elementwise;
        }
        builtin_fusible(op)
    }

    fn fusion_prefix(&self) -> &str {
        "Cuda"
    }

    fn options(&self) -> &[OptionSpec] {
        CUDA_OPTIONS
    }

    fn configured_options(&self) -> Vec<(&'static str, OptionValue)> {
        self.variants.configured()
    }
}

/// Runs every built-in prim on the device: elementwise prims, last-axis `sum` and `max`, and
/// the shape ops `reshape`, `transpose` and `broadcast_to` (one generated kernel each), and
/// `matmul` (cuBLASLt); and composites whole (it [prefers them whole](Executor::prefers_whole)):
/// `linear` as one cuBLASLt product that reads the weight transposed and adds the bias in its
/// epilogue, `softmax`, `layer_norm` and `layer_norm_backward` as one generated kernel each,
/// laid out by row length, `layer_norm_weight_backward` as two, attention and its backward
/// (cuDNN), `cross_entropy` and its backward.
pub struct CudaOps {
    device: Arc<CudaDevice>,
    lt: Arc<Mutex<Option<LtContext>>>,
    attention: Attention,
    variants: KernelVariants,
}

impl CudaOps {
    /// The executor's name.
    pub const NAME: &'static str = "cuda_ops";

    /// On `device`, generating the default kernels.
    pub fn new(device: Arc<CudaDevice>) -> Self {
        Self {
            device,
            lt: Arc::new(Mutex::new(None)),
            attention: Attention::default(),
            variants: KernelVariants::default(),
        }
    }

    /// On `device`, generating the [`KernelVariants`] that `options` choose (`cuda.*`,
    /// developer options).
    ///
    /// # Errors
    /// As [`KernelVariants::from_options`].
    pub fn from_options(device: Arc<CudaDevice>, options: &Options) -> Result<Self> {
        Ok(Self::new(device).with_variants(KernelVariants::from_options(options)?))
    }

    /// The same executor, generating `variants` of its kernels (plans list those that are not
    /// the defaults in their header).
    pub fn with_variants(self, variants: KernelVariants) -> Self {
        Self { variants, ..self }
    }

    /// The kernel of a built-in `softmax` or `layer_norm` (`layer_norm_backward`'s input
    /// gradient where `backward`) with `variants`, ready to launch.
    fn row_kernel(&self, op: &OpView<'_>, backward: bool, variants: KernelVariants) -> Result<GeneratedKernel> {
        let name = kernel_name(op.name());
        let rows = if backward {
            layer_norm_backward::input_source(op, &name)
        } else {
            let device = &self.device;
            let target = RowTarget {
                // The kernel's own shared arrays (a few hundred bytes) take from the same limit.
                shared_limit: device.shared_memory_per_block().saturating_sub(1024),
                sm_shared: device.shared_memory_per_sm(),
                region: region_target(device),
            };
            row_source(op, &name, target, variants)
        };
        let rows = rows.map_err(|detail| Error::KernelPrecondition {
            executor: Self::NAME.into(),
            symbol: op.name().into(),
            detail,
        })?;
        let mut kernel = GeneratedKernel::new(&self.device, &rows.source, None)?;
        if rows.source.cluster > MAX_CLUSTER_BLOCKS {
            // Past CUDA's portable cluster size (`KernelVariants::wave_clusters_of_16`): the
            // kernel opts in, before its clusters are counted (`fitted`) and launched. A GPU
            // that refuses takes it as clusters that do not fit: `fitted` makes another.
            let opted_in = kernel
                .function
                .set_attribute(sys::CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1);
            kernel.beyond_portable_clusters = Some(opted_in.is_ok());
        }
        let (block, shared) = (rows.layout.block as u32, rows.shared_bytes);
        if shared > 0 {
            kernel
                .function
                .set_attribute(
                    sys::CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    shared as i32,
                )
                .map_err(|e| cuda_error("a row kernel's shared memory", e))?;
        }
        kernel.config =
            LaunchConfig { grid_dim: (rows.blocks, 1, 1), block_dim: (block, 1, 1), shared_mem_bytes: shared as u32 };
        Ok(kernel)
    }
}

impl Executor for CudaOps {
    fn name(&self) -> &str {
        Self::NAME
    }

    fn claims(&self, op: &OpView<'_>) -> bool {
        // Moves take every dtype (their kernels copy bits); `argmax` writes i64. Everything
        // else computes on floats: what the generator compiles (everything fusible, casts, the
        // transformer ops of `index_ops`) and cuBLASLt's products, so that a plan's values stay
        // on the device. Products take operands of one dtype (cast mixed ones first).
        let moves = matches!(
            builtin_prim(op),
            Some(prims::RESHAPE | prims::TRANSPOSE | prims::BROADCAST_TO | prims::SLICE | prims::CONCAT | prims::PAD)
        );
        let makes_integers =
            matches!(builtin_prim(op), Some(id) if id == prims::ARGMAX || prims::COMPARISONS.contains(&id));
        let gathers = gather::generates(op) || cross_entropy::runs_whole(op) || cross_entropy::runs_backward_whole(op);
        if moves || makes_integers || gathers || (builtin_prim(op) == Some(prims::WHERE) && index_ops::generates(op)) {
            return true;
        }
        if op.dtypes().iter().any(|d| d.is_integer()) {
            return false;
        }
        builtin_fusible(op) != Fusible::No
            || builtin_prim(op) == Some(prims::CAST)
            || index_ops::generates(op)
            || (builtin_prim(op) == Some(prims::MATMUL) && single_dtype(op).is_ok() && nonempty_product(op))
            || self.prefers_whole(op)
    }

    /// Every dtype: every float op runs in bf16 and f16 too (products of one dtype); integer
    /// tensors are moved (reshape, transpose, slice, ...), made (`argmax`, comparisons) and
    /// read as ids (`embedding`, `gather_last`, `cross_entropy`, checked on the device) there;
    /// other ops on integers (casts, `where` of mixed dtypes) run on the CPU executors.
    fn dtypes(&self) -> &[crate::DType] {
        &crate::DType::ALL
    }

    /// Not where guards sit on a composite's subsymbols: only its decomposition runs those.
    fn prefers_whole(&self, op: &OpView<'_>) -> bool {
        if op.has_subsymbol_guards() {
            return false;
        }
        match op.symbol().builtin_composite() {
            Some(prims::LINEAR | prims::LINEAR_GELU) => single_dtype(op).is_ok() && nonempty_product(op),
            Some(prims::MATMUL_TRANSPOSED | prims::TRANSPOSED_MATMUL) => {
                single_dtype(op).is_ok() && nonempty_product(op)
            }
            Some(prims::CROSS_ENTROPY) => cross_entropy::runs_whole(op),
            Some(prims::CROSS_ENTROPY_BACKWARD) => cross_entropy::runs_backward_whole(op),
            Some(prims::SOFTMAX | prims::LAYER_NORM) => true,
            Some(prims::LAYER_NORM_BACKWARD | prims::LAYER_NORM_WEIGHT_BACKWARD) => layer_norm_backward::runs_whole(op),
            Some(prims::SCALED_DOT_PRODUCT_ATTENTION | prims::QKV_ATTENTION) => {
                matches!(attention::plan_for(&self.attention, &self.device, op), Some(Ok(_)))
                    || flash_operands(op).is_some()
            }
            Some(prims::SCALED_DOT_PRODUCT_ATTENTION_BACKWARD | prims::QKV_ATTENTION_BACKWARD) => {
                matches!(attention::backward_plans_for(&self.attention, &self.device, op), Some(Ok(_)))
                    || flash_backward_on(&self.device, op).is_some()
            }
            _ => false,
        }
    }

    fn device(&self) -> Option<Arc<dyn Device>> {
        Some(self.device.clone())
    }

    fn options(&self) -> &[OptionSpec] {
        CUDA_OPTIONS
    }

    fn configured_options(&self) -> Vec<(&'static str, OptionValue)> {
        self.variants.configured()
    }

    fn compile_device(&self, op: &OpView<'_>) -> Result<Box<dyn DeviceKernel>> {
        // Attention: cuDNN's fused kernel where it runs the shape, else the generated one.
        match attention::plan_for(&self.attention, &self.device, op) {
            Some(Ok(plan)) => return Ok(Box::new(self.attention.kernel(self.device.clone(), plan))),
            _ if flash_operands(op).is_some() => {
                return Ok(Box::new(FlashAttention::new(&self.device, op, &kernel_name(op.name()))?));
            }
            Some(Err(detail)) => {
                return Err(Error::KernelPrecondition { executor: Self::NAME.into(), symbol: op.name().into(), detail })
            }
            None => {}
        }
        match attention::backward_plans_for(&self.attention, &self.device, op) {
            Some(Ok(plans)) => return Ok(Box::new(self.attention.backward_kernel(self.device.clone(), plans))),
            _ if flash_backward_on(&self.device, op).is_some() => {
                return Ok(Box::new(FlashAttentionBackward::new(&self.device, op, &kernel_name(op.name()))?));
            }
            Some(Err(detail)) => {
                return Err(Error::KernelPrecondition { executor: Self::NAME.into(), symbol: op.name().into(), detail })
            }
            None => {}
        }
        let transposed =
            matches!(op.symbol().builtin_composite(), Some(prims::MATMUL_TRANSPOSED | prims::TRANSPOSED_MATMUL));
        if builtin_prim(op) == Some(prims::MATMUL) || transposed {
            if !transposed {
                require_builtin(Self::NAME, prims::MATMUL, op)?;
            }
            let shape = product_shape(op).ok_or_else(|| Error::KernelPrecondition {
                executor: Self::NAME.into(),
                symbol: op.name().into(),
                detail: "its operands' batch dimensions are neither the output's nor all 1 (one strided batched \
                         product cannot read them; broadcast_to first)"
                    .into(),
            })?;
            let shape = GemmShape { dtype: single_dtype(op)?, ..shape };
            return Ok(Box::new(LtGemm::new(self.device.clone(), self.lt.clone(), shape, "matmul")?));
        }
        let composite = op.symbol().builtin_composite();
        if composite == Some(prims::LAYER_NORM_WEIGHT_BACKWARD) {
            let kernel = layer_norm_backward::WeightBackward::new(&self.device, op, &kernel_name(op.name()))?;
            return Ok(Box::new(kernel));
        }
        if matches!(composite, Some(prims::SOFTMAX | prims::LAYER_NORM | prims::LAYER_NORM_BACKWARD)) {
            let backward = composite == Some(prims::LAYER_NORM_BACKWARD);
            return Ok(Box::new(fitted(self.variants, |variants| self.row_kernel(op, backward, variants))?));
        }
        if cross_entropy::runs_whole(op) {
            return Ok(Box::new(cross_entropy::CrossEntropy::new(&self.device, op, &kernel_name(op.name()))?));
        }
        if cross_entropy::runs_backward_whole(op) {
            let kernel = cross_entropy::CrossEntropyBackward::new(&self.device, op, &kernel_name(op.name()))?;
            return Ok(Box::new(kernel));
        }
        if self.prefers_whole(op) {
            let shape = linear_shape(op).map_err(|detail| Error::KernelPrecondition {
                executor: Self::NAME.into(),
                symbol: op.name().into(),
                detail,
            })?;
            let name = if shape.gelu { "linear_gelu" } else { "linear" };
            return Ok(Box::new(LtGemm::new(self.device.clone(), self.lt.clone(), shape, name)?));
        }
        if gather::generates(op) {
            return Ok(Box::new(gather::CheckedGather::new(&self.device, op, &kernel_name(op.name()))?));
        }
        let is_shape_op = matches!(builtin_prim(op), Some(prims::RESHAPE | prims::TRANSPOSE | prims::BROADCAST_TO));
        let name = kernel_name(op.name());
        let precondition =
            |detail| Error::KernelPrecondition { executor: Self::NAME.into(), symbol: op.name().into(), detail };
        let generated = if is_shape_op {
            shape_op_source(op, &name)
        } else if index_ops::generates(op) {
            index_ops::index_op_source(op, &name)
        } else {
            let kernel = fitted_kernel(&self.device, self.variants, None, |variants, target| {
                op_source_for(op, &name, variants, target).map_err(precondition)
            })?;
            return Ok(Box::new(kernel));
        };
        Ok(Box::new(GeneratedKernel::new(&self.device, &generated.map_err(precondition)?, None)?))
    }
}

/// The kernel `build` makes with `variants`; or, where its rows are split over thread-block
/// clusters that the GPU cannot run at once ([`GeneratedKernel::clusters_fit`]), the kernel it
/// makes without splitting them ([`KernelVariants::unsplit`]).
fn fitted(
    variants: KernelVariants,
    build: impl Fn(KernelVariants) -> Result<GeneratedKernel>,
) -> Result<GeneratedKernel> {
    let kernel = build(variants)?;
    if kernel.clusters_fit()? {
        return Ok(kernel);
    }
    // Clusters past CUDA's portable size first fall back to portable ones.
    if kernel.beyond_portable_clusters.is_some() {
        let portable = build(KernelVariants { wave_clusters_of_16: false, ..variants })?;
        if portable.clusters_fit()? {
            return Ok(portable);
        }
    }
    build(variants.unsplit())
}

/// The kernel `generate` writes with `variants` for `device`, compiled ([`fitted`]), pushing
/// `range`.
fn fitted_kernel(
    device: &Arc<CudaDevice>,
    variants: KernelVariants,
    range: Option<PreparedRegionRange>,
    generate: impl Fn(KernelVariants, RegionTarget) -> Result<RegionSource>,
) -> Result<GeneratedKernel> {
    let target = region_target(device);
    let kernel = fitted(variants, |variants| GeneratedKernel::new(device, &generate(variants, target)?, None))?;
    Ok(GeneratedKernel { range, ..kernel })
}

/// What the generated kernels are chosen by on `device`: its L2, SMs and clusters.
fn region_target(device: &CudaDevice) -> RegionTarget {
    RegionTarget { l2_bytes: device.l2_cache_bytes(), sms: device.multiprocessors(), clusters: device.clusters() }
}

fn kernel_name(name: &str) -> String {
    let clean: String = name.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
    format!("boundscope_{clean}")
}

/// Parameters (one per buffer and the element count) a generated kernel's launch lists on the
/// stack, at most.
const INLINE_PARAMS: usize = 17;

thread_local! {
    /// The pointer and parameter lists of launches of more than [`INLINE_PARAMS`] parameters.
    static LAUNCH_LISTS: std::cell::RefCell<(Vec<sys::CUdeviceptr>, Vec<*mut c_void>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

/// A generated kernel: one pointer per input and output, then the element count.
struct GeneratedKernel {
    device: Arc<CudaDevice>,
    function: CudaFunction,
    kernel: String,
    config: LaunchConfig,
    numel: i64,
    lengths: BufferLengths,
    range: Option<PreparedRegionRange>,
    /// The `(input, output)` pairs it may write over ([`RegionSource::in_place`]).
    in_place: Vec<(usize, usize)>,
    /// Blocks a thread-block cluster ([`RegionSource::cluster`]).
    cluster: usize,
    /// For clusters past CUDA's portable size: whether the GPU took the kernel's opt-in
    /// (`CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED`); `None` for other kernels.
    beyond_portable_clusters: Option<bool>,
}

impl GeneratedKernel {
    fn new(device: &Arc<CudaDevice>, generated: &RegionSource, range: Option<PreparedRegionRange>) -> Result<Self> {
        let function = device.function(generated)?;
        // One thread per vector (or element, or warp per row): a full grid, not a grid-stride
        // loop over a few blocks per multiprocessor, keeps more loads in flight (measured on the
        // H200: +7% at 2^28 floats). The kernels still loop, for grids past CUDA's limit.
        let blocks = (generated.threads.div_ceil(THREADS as usize).min(i32::MAX as usize) as u32).max(1);
        let config = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 };
        let (kernel, numel) = (generated.kernel.clone(), generated.numel as i64);
        let lengths =
            BufferLengths { inputs: generated.input_lengths.clone(), outputs: generated.output_lengths.clone() };
        let in_place = generated.in_place.clone();
        let cluster = generated.cluster;
        let beyond_portable_clusters = None;
        Ok(Self {
            device: device.clone(),
            function,
            kernel,
            config,
            numel,
            lengths,
            range,
            in_place,
            cluster,
            beyond_portable_clusters,
        })
    }

    /// Whether the GPU can run its thread-block clusters at once, as the driver counts them
    /// (`cuOccupancyMaxActiveClusters`: a MIG instance or an MPS limit may leave too few SMs
    /// of a GPC); always, for a kernel of no clusters. Clusters past the portable size fit only
    /// where the GPU took the kernel's opt-in and counts some (an error counting them is taken
    /// as none).
    fn clusters_fit(&self) -> Result<bool> {
        match self.beyond_portable_clusters {
            Some(false) => Ok(false),
            Some(true) => Ok(self.device.clusters_that_fit(&self.function, self.config).is_ok_and(|n| n > 0)),
            None => Ok(self.cluster == 1 || self.device.clusters_that_fit(&self.function, self.config)? > 0),
        }
    }

    fn launch(&self, inputs: &[&dyn DeviceBuffer], outputs: &mut [&mut dyn DeviceBuffer]) -> Result<()> {
        self.lengths.check_in_place(&self.kernel, inputs, outputs, &self.in_place)?;
        // The arguments, on the stack: cudarc's launch builder collects them in a `Vec`, an
        // allocation per launch that a steady-state run must not make. The lists are as short as
        // the launch allows (zeroing lists of 16 and 17 took 13 of the runtime's 749
        // instructions a step: `scripts/host-cost`). Regions of more buffers than the stack
        // holds use a list kept per thread, grown by the first such launch.
        let buffers = inputs.len() + outputs.len();
        match buffers + 1 {
            ..=4 => self.launch_inline::<4>(inputs, outputs),
            5..=8 => self.launch_inline::<8>(inputs, outputs),
            9..=INLINE_PARAMS => self.launch_inline::<INLINE_PARAMS>(inputs, outputs),
            _ => LAUNCH_LISTS.with(|lists| {
                let (pointers, params) = &mut *lists.borrow_mut();
                pointers.resize(buffers, 0);
                params.resize(buffers + 1, std::ptr::null_mut());
                self.launch_with(inputs, outputs, &mut pointers[..buffers], &mut params[..=buffers])
            }),
        }
    }

    /// [`launch`](Self::launch) with lists on the stack of `N` parameters, one more than the
    /// buffers at most.
    #[inline(always)]
    fn launch_inline<const N: usize>(
        &self,
        inputs: &[&dyn DeviceBuffer],
        outputs: &mut [&mut dyn DeviceBuffer],
    ) -> Result<()> {
        let buffers = inputs.len() + outputs.len();
        let mut pointers = [0; N];
        let mut params = [std::ptr::null_mut(); N];
        self.launch_with(inputs, outputs, &mut pointers[..buffers], &mut params[..=buffers])
    }

    /// [`launch`](Self::launch) with `pointers` (one per buffer) and `params` (one more) to
    /// fill.
    fn launch_with(
        &self,
        inputs: &[&dyn DeviceBuffer],
        outputs: &mut [&mut dyn DeviceBuffer],
        pointers: &mut [sys::CUdeviceptr],
        params: &mut [*mut c_void],
    ) -> Result<()> {
        let stream = self.device.stream();
        let (input_pointers, output_pointers) = pointers.split_at_mut(inputs.len());
        for (pointer, input) in input_pointers.iter_mut().zip(inputs) {
            // (An input written over is empty: its pointer is its output's, set below.)
            *pointer = if input.is_empty() { 0 } else { address(*input)? };
        }
        for (pointer, output) in output_pointers.iter_mut().zip(outputs.iter()) {
            *pointer = address(&**output)?;
        }
        for &(k, o) in &self.in_place {
            if inputs[k].is_empty() {
                pointers[k] = pointers[inputs.len() + o];
            }
        }
        let mut numel = self.numel;
        let (last, pointer_params) = params.split_last_mut().ok_or_else(|| cuda_error("launch", "no parameters"))?;
        for (param, pointer) in pointer_params.iter_mut().zip(pointers.iter_mut()) {
            *param = (pointer as *mut sys::CUdeviceptr).cast::<c_void>();
        }
        *last = (&mut numel as *mut i64).cast::<c_void>();
        // SAFETY: the generated kernel takes exactly one pointer per region input and output
        // (in this order), then `long long n`, and `params` points at exactly those values,
        // which outlive the call (`pointers` is not touched after `params` is made); `lengths.check`
        // made sure that there are that many buffers, each holding at least the elements of its
        // value, and the generator (`fused_shape`) that the kernel accesses no more than those.
        // The buffers' own synchronization is off on this device (`CudaDevice::new`): the
        // runtime orders its streams itself (`stream_order`), and a run's work goes to its
        // workspace's stream.
        unsafe { super::device_checks::launch(&self.function, &stream, self.config, params) }
    }
}

impl DeviceKernel for GeneratedKernel {
    fn run(&self, inputs: &[&dyn DeviceBuffer], outputs: &mut [&mut dyn DeviceBuffer]) -> Result<()> {
        match &self.range {
            Some(range) => range.in_scope(|| self.launch(inputs, outputs)),
            None => self.launch(inputs, outputs),
        }
    }

    fn in_place(&self, input: usize, output: usize) -> bool {
        self.in_place.contains(&(input, output))
    }

    /// Kernels whose rows are split over thread-block clusters say so (`128 blocks in clusters
    /// of 8`); others say nothing.
    fn launch_note(&self) -> Option<String> {
        (self.cluster > 1).then(|| format!("{} blocks in clusters of {}", self.config.grid_dim.0, self.cluster))
    }
}

/// The product `linear(x, w, bias)` is, from its shapes: `x [m, k]`, `w [n, k]`, `bias [n]`
/// (the relations `linear`'s shape rule states, checked again since a kernel relies on them).
fn linear_shape(op: &OpView<'_>) -> std::result::Result<GemmShape, String> {
    let inputs = op.bound_symbol().inputs().count();
    let shape = |i: usize| op.input_shape(i).map_err(|e| e.to_string());
    let (x, w) = (shape(0)?, shape(1)?);
    let (m, k, n) = match (x, w) {
        ([m, k], [n, k2]) if k == k2 => (*m, *k, *n),
        _ => return Err(format!("linear takes x [m, k] and w [n, k], not {x:?} and {w:?}")),
    };
    if inputs == 3 && shape(2)? != [n] {
        return Err(format!("the bias must be [{n}], not {:?}", shape(2)?));
    }
    if !(2..=3).contains(&inputs) {
        return Err(format!("linear takes 2 or 3 tensors, not {inputs}"));
    }
    let dtype = single_dtype(op).map_err(|e| e.to_string())?;
    let gelu = op.symbol().builtin_composite() == Some(prims::LINEAR_GELU);
    Ok(GemmShape { b_transposed: true, bias: inputs == 3, gelu, ..GemmShape::single(m, n, k, dtype) })
}

/// `matmul`'s product as one strided batched call, if it is one: each operand's batch
/// dimensions are the output's (a matrix per batch index) or all 1 (one matrix, read by every
/// product, at a stride of 0). Other broadcasts are not claimed (the CPU reference runs them).
fn product_shape(op: &OpView<'_>) -> Option<GemmShape> {
    let transposed = op.symbol().builtin_composite() == Some(prims::MATMUL_TRANSPOSED);
    let a_transposed = op.symbol().builtin_composite() == Some(prims::TRANSPOSED_MATMUL);
    let (a, b, out) = (op.input_shape(0).ok()?, op.input_shape(1).ok()?, op.output_shape(0).ok()?);
    let (ra, rb, ro) = (a.len(), b.len(), out.len());
    if ra < 2 || rb < 2 || ro < 2 {
        return None;
    }
    let batch_dims = &out[..ro - 2];
    let batched = |dims: &[usize]| -> Option<bool> {
        let own: usize = dims.iter().product();
        let full = dims.len() <= batch_dims.len() && dims == &batch_dims[batch_dims.len() - dims.len()..];
        match (own == batch_dims.iter().product::<usize>() && full, own == 1) {
            (true, _) => Some(own > 1),
            (false, true) => Some(false),
            _ => None,
        }
    };
    let (a_batched, b_batched) = (batched(&a[..ra - 2])?, batched(&b[..rb - 2])?);
    // `matmul_transposed` reads `b` as [..., n, k]: cuBLASLt's transpose flag, as for `linear`.
    let (n, k) = if transposed { (b[rb - 2], b[rb - 1]) } else { (b[rb - 1], b[rb - 2]) };
    // `transposed_matmul` reads `a` as [..., k, m]: the flag on cuBLASLt's other operand.
    let (m, a_k) = if a_transposed { (a[ra - 1], a[ra - 2]) } else { (a[ra - 2], a[ra - 1]) };
    // The relations the buffers' sizes rest on, checked again: nothing on the device checks.
    if k != a_k || out[ro - 2..] != [m, n] {
        return None;
    }
    let shape = GemmShape::single(m, n, k, crate::DType::F32);
    Some(GemmShape {
        batch: batch_dims.iter().product(),
        a_batched,
        b_batched,
        b_transposed: transposed,
        a_transposed,
        ..shape
    })
}

/// Whether a product's `m`, `n` and `k` are all non-zero: cuBLASLt takes no empty product,
/// so an empty one is left to another executor (the CPU reference's gives zeros, or the bias).
fn nonempty_product(op: &OpView<'_>) -> bool {
    let dims = |i: usize| op.input_shape(i).map(<[usize]>::to_vec).unwrap_or_default();
    let (x, y) = (dims(0), dims(1));
    let two_d = x.len() == 2 && y.len() == 2;
    let product = builtin_prim(op) == Some(prims::MATMUL)
        || matches!(op.symbol().builtin_composite(), Some(prims::MATMUL_TRANSPOSED | prims::TRANSPOSED_MATMUL));
    let batched = product && product_shape(op).is_some();
    x.iter().chain(&y).all(|&d| d > 0) && (two_d || batched)
}

/// The one dtype of all of `op`'s tensors (cuBLASLt's products here take operands of one
/// dtype), or why not.
fn single_dtype(op: &OpView<'_>) -> Result<crate::DType> {
    match op.dtypes().as_slice() {
        [] => Ok(crate::DType::F32),
        &[only] => Ok(only),
        &[first, other, ..] => Err(Error::KernelPrecondition {
            executor: CudaOps::NAME.into(),
            symbol: op.name().into(),
            detail: format!(
                "its operands are {first} and {other}; cuBLASLt's products here take one dtype (cast first)"
            ),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::ir::{Arena, Registry, TensorMeta, TraceBuilder};
    use crate::core::plan::Availability;
    use crate::DType;

    /// On a GPU with thread-block clusters, the kernels that split rows over them
    /// ([`KernelVariants::split_rows`], [`KernelVariants::split_reductions`]) fit it as
    /// clusters, as the driver counts them, so that the fallback for a GPU that cannot run them
    /// at once (unsplit rows) leaves them split.
    /// (Run on an H100, 2026-12-06, before the query bound the context; the fallback itself
    /// needs a GPU whose clusters do not fit, such as a small MIG instance, to be seen.)
    /// Needs a GPU: prints why it is skipped without one.
    #[test]
    fn split_row_kernels_fit_the_gpu_as_clusters() {
        let device = match super::super::availability() {
            Availability::Available => CudaDevice::new().unwrap(),
            Availability::Unavailable(reason) => {
                println!("SKIPPED: split_row_kernels_fit_the_gpu_as_clusters: {reason}; run the library's tests on a GPU machine");
                return;
            }
        };
        if !device.clusters() {
            println!("SKIPPED: split_row_kernels_fit_the_gpu_as_clusters: this GPU has no thread-block clusters");
            return;
        }
        let variants = KernelVariants { split_rows: true, ..KernelVariants::default() };
        let ops = CudaOps::new(device.clone()).with_variants(variants);
        let registry = Registry::with_builtins();
        // Rows fewer than the GPU's SMs, so that they are split (or kept on chip, f16 rows of
        // 262,144 values: `clustered_rows`) over clusters on any GPU with clusters.
        let few = (device.multiprocessors() / 2).max(1);
        for (shape, dtype) in [([few, 1 << 20], DType::F32), ([1, 1 << 20], DType::BF16), ([few, 262144], DType::F16)] {
            for layer_norm in [false, true] {
                let arena = Arena::new();
                let mut b = TraceBuilder::new(&arena, &registry);
                let x = b.input_with(&TensorMeta::new(dtype, &shape)).unwrap();
                let y = if layer_norm {
                    let w = b.input_with(&TensorMeta::new(dtype, &shape[1..])).unwrap();
                    let bias = b.input_with(&TensorMeta::new(dtype, &shape[1..])).unwrap();
                    b.layer_norm(x, 1e-5, Some(w), Some(bias)).unwrap()
                } else {
                    b.softmax(x).unwrap()
                };
                b.output(y).unwrap();
                let trace = b.finish().unwrap();
                let op = OpView::new(&trace, trace.bound_symbols().last().unwrap()).unwrap();
                let kernel = ops.row_kernel(&op, false, variants).unwrap();
                let cluster = kernel.cluster;
                let what = format!("{layer_norm} {dtype} {shape:?}");
                assert!(cluster > 1, "{what}: not split");
                let fit = device.clusters_that_fit(&kernel.function, kernel.config).unwrap();
                assert!(fit > 0, "{what}: clusters of {cluster} do not fit");
            }
        }
        // Clusters of 16 (`wave_clusters_of_16`), past CUDA's portable size: the kernel opts in,
        // and Hopper runs them; a GPU that would not gets clusters of 8 from `fitted`.
        let waves = KernelVariants { streamed_split_waves: true, wave_clusters_of_16: true, ..variants };
        let arena = Arena::new();
        let mut b = TraceBuilder::new(&arena, &registry);
        let x = b.input_with(&TensorMeta::new(DType::F32, &[few, 1 << 20])).unwrap();
        let y = b.softmax(x).unwrap();
        b.output(y).unwrap();
        let trace = b.finish().unwrap();
        let op = OpView::new(&trace, trace.bound_symbols().last().unwrap()).unwrap();
        let kernel = fitted(waves, |v| ops.row_kernel(&op, false, v)).unwrap();
        assert!(kernel.clusters_fit().unwrap(), "clusters of {}", kernel.cluster);
        if device.arch() == Some("compute_90") {
            assert_eq!(kernel.cluster, 16, "Hopper runs clusters of 16");
        }
        // Reductions split over clusters too ([`KernelVariants::split_reductions`]).
        let target = RegionTarget { clusters: true, ..region_target(&device) };
        for (max, dtype) in [(false, DType::F32), (true, DType::BF16)] {
            let arena = Arena::new();
            let mut b = TraceBuilder::new(&arena, &registry);
            let x = b.input_with(&TensorMeta::new(dtype, &[few, 1 << 20])).unwrap();
            let y = if max { b.max(x).unwrap() } else { b.sum(x).unwrap() };
            b.output(y).unwrap();
            let trace = b.finish().unwrap();
            let op = OpView::new(&trace, trace.bound_symbols().last().unwrap()).unwrap();
            let generated = op_source_for(&op, "split_reduction", KernelVariants::default(), target).unwrap();
            let kernel = GeneratedKernel::new(&device, &generated, None).unwrap();
            assert!(generated.cluster > 1, "{dtype} max: {max}: not split");
            let fit = device.clusters_that_fit(&kernel.function, kernel.config).unwrap();
            assert!(fit > 0, "{dtype} max: {max}: clusters of {} do not fit", generated.cluster);
            // The plan's listing says so.
            let plan = crate::Plan::compile(&trace, &[Arc::new(CudaOps::new(device.clone()))]).unwrap();
            let note = format!("{} blocks in clusters of {}", few * generated.cluster, generated.cluster);
            assert!(plan.to_string().contains(&note), "{dtype} max: {max}: {plan}");
        }
    }
}
