//! `layer_norm`'s backward on the GPU, what `passes::Grad` writes for it:
//!
//! - `layer_norm_backward(x, grad, eps, weight?)` (the gradient of `x`) as one row kernel, laid
//!   out by row length as the forward ([`RowLayout`]): each row of `x` and of the gradient read
//!   once into registers, the mean and variance taken again, the two sums of the gradient's
//!   projection, and the result written once in `x`'s dtype;
//! - `layer_norm_weight_backward(x, grad, eps)` (the weight's and bias's gradients, `f32`
//!   `[2, n]`) as two kernels: each block sums `grad * normalised x` and `grad` per column over
//!   its rows (every thread keeps its columns' sums in registers, a block adds its threads'
//!   in shared memory in a fixed order), then a second kernel adds the blocks' sums, in a
//!   fixed order too: the same bits on every run. The blocks' sums live in a scratch buffer
//!   per stream.
//!
//! Both compute in `f32` throughout and round once, as PyTorch's kernels do; their arithmetic
//! is the decompositions' (`1/sqrt(v)` is `exp(-0.5 * log(v))`), so they differ from the CPU
//! reference by the order of the sums and by CUDA's `expf` and `logf`. Rows too long for
//! registers, and weight gradients of rows longer than [`MAX_WEIGHT_COLUMNS`], run as the
//! decompositions instead.

use std::ffi::c_void;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};

use cudarc::driver::{sys, CudaFunction, DevicePtr, LaunchConfig};

use super::codegen::{element_type, literal, RegionSource, HALF_CONVERSIONS};
use super::device::{address, CudaDevice};
use super::device_checks::{launch, BufferLengths};
use super::row_kernels::{load, open_rows, row_reduce, store, RowLayout, RowSource};
use super::stream_workspaces::StreamWorkspaces;
use crate::core::ir::{prims, DType};
use crate::core::plan::{packing, DeviceBuffer, DeviceKernel, OpView};
use crate::error::{Error, Result};

/// Values of each row array a thread of `layer_norm_backward` keeps in registers (it keeps two:
/// `x` and the gradient).
const INPUT_VALUES: usize = 24;

/// Values of each row array a thread of `layer_norm_weight_backward` keeps in registers (`x`
/// and the gradient, beside two sums per value): 24 keeps GPT-2's rows of 768 to a warp.
const WEIGHT_VALUES: usize = 24;

/// The longest rows whose weight gradient runs whole: a block adds its sums of each column in
/// shared memory (`2 * 4` bytes a column).
pub(super) const MAX_WEIGHT_COLUMNS: usize = 4096;

/// Blocks of partial sums at most (about four per multiprocessor of an H100 or H200: enough
/// rows in flight to read at memory speed).
const MAX_WEIGHT_BLOCKS: usize = 512;

/// The row layout of a built-in `layer_norm_backward` or `layer_norm_weight_backward` whose
/// operands fit its rules, with the tensors' dtypes; `None` for other ops.
fn operands(op: &OpView<'_>) -> Option<(usize, usize, Vec<DType>)> {
    let id = op.symbol().builtin_composite()?;
    let dtypes: Vec<DType> = op.bound_symbol().inputs().map(|v| op.dtype_of(v)).collect();
    let tensors_ok = match id {
        prims::LAYER_NORM_BACKWARD => (2..=3).contains(&dtypes.len()),
        prims::LAYER_NORM_WEIGHT_BACKWARD => dtypes.len() == 2,
        _ => false,
    };
    if !tensors_ok || !dtypes.iter().all(|d| d.is_float()) {
        return None;
    }
    let shape = op.input_shape(0).ok()?;
    let cols = *shape.last()?;
    if op.input_shape(1).ok()? != shape || (dtypes.len() == 3 && op.input_shape(2).ok()? != [cols]) {
        return None;
    }
    Some((shape[..shape.len() - 1].iter().product(), cols, dtypes))
}

/// Whether CudaOps runs `op` (a `layer_norm_backward` or `layer_norm_weight_backward`) whole:
/// its rows fit in registers (and, for the weight's, in a block's shared memory).
pub(super) fn runs_whole(op: &OpView<'_>) -> bool {
    let Some((_, cols, dtypes)) = operands(op) else { return false };
    if cols == 0 {
        return false;
    }
    let widest = dtypes.iter().map(|d| d.size_bytes()).max().unwrap_or(4);
    match op.symbol().builtin_composite() {
        Some(prims::LAYER_NORM_BACKWARD) => RowLayout::within(cols, widest, INPUT_VALUES).per_thread.is_some(),
        _ => cols <= MAX_WEIGHT_COLUMNS && RowLayout::within(cols, widest, WEIGHT_VALUES).per_thread.is_some(),
    }
}

/// The C that loads a row's values into `float name[]` (zeros past the row), each thread its
/// `per_thread` accesses of `v` values, `t` threads a row.
fn load_row(
    c: &mut String,
    name: &str,
    dtype: DType,
    (t, v, per_thread): (usize, usize, usize),
    cols: usize,
    k: usize,
) {
    let _ = writeln!(c, "    float {name}[{}];", per_thread * v);
    let _ = writeln!(c, "    #pragma unroll");
    let _ = writeln!(c, "    for (int j = 0; j < {per_thread}; ++j) {{");
    let _ = writeln!(c, "      const long long col = ((long long)j * {t} + lane) * {v};");
    let _ = writeln!(
        c,
        "      if (valid && col < {cols}ll) {}",
        load(dtype, v, &format!("in{k} + row + col"), &format!("({name} + j * {v})"))
    );
    let _ = writeln!(c, "      else {{ for (int e = 0; e < {v}; ++e) {name}[j * {v} + e] = 0.0f; }}");
    let _ = writeln!(c, "    }}");
}

/// The C that takes a row's `mean` and `inv_std` from `xv` (loaded by [`load_row`]).
fn row_statistics(c: &mut String, (t, v, per_thread): (usize, usize, usize), cols: usize, eps: f32) {
    let inverse = literal(1.0 / cols as f32);
    let each = format!("for (int j = 0; j < {per_thread}; ++j) for (int e = 0; e < {v}; ++e)");
    let in_row = format!("(valid && ((long long)j * {t} + lane) * {v} + e < {cols}ll)");
    let sum = |a: &str, b: &str| format!("{a} + {b}");
    let _ = writeln!(c, "    float acc = 0.0f;");
    let _ = writeln!(c, "    {each} acc = acc + xv[j * {v} + e];");
    row_reduce(c, t, &sum);
    let _ = writeln!(c, "    const float mean = acc * {inverse};");
    let _ = writeln!(c, "    acc = 0.0f;");
    let _ = writeln!(c, "    {each} if {in_row} {{ const float d = xv[j * {v} + e] - mean; acc = acc + d * d; }}");
    row_reduce(c, t, &sum);
    let _ = writeln!(c, "    const float variance = acc * {inverse};");
    let _ = writeln!(c, "    const float inv_std = expf(logf(variance + {}) * -0.5f);", literal(eps));
}

/// The kernel of a built-in `layer_norm_backward(x, grad, eps, weight?)` (run like the forward
/// row kernels: one pointer per tensor, the output, then `long long n`), or why there is none.
pub(super) fn input_source(op: &OpView<'_>, kernel: &str) -> std::result::Result<RowSource, String> {
    let (rows, cols, dtypes) = operands(op).ok_or_else(|| format!("`{}` is not layer_norm_backward", op.name()))?;
    if op.symbol().builtin_composite() != Some(prims::LAYER_NORM_BACKWARD) {
        return Err(format!("`{}` is not layer_norm_backward", op.name()));
    }
    let eps = op.scalar(2).map_err(|e| e.to_string())?;
    let out_dtype = op.dtype_of(op.bound_symbol().outputs()[0]);
    let widest = dtypes.iter().chain([&out_dtype]).map(|d| d.size_bytes()).max().unwrap_or(4);
    let layout = RowLayout::within(cols, widest, INPUT_VALUES);
    let per_thread = layout.per_thread.ok_or_else(|| format!("rows of {cols} do not fit in registers"))?;
    let RowLayout { threads_per_row: t, vector: v, block, .. } = layout;
    let shape = (t, v, per_thread);
    let numel = rows * cols;
    let mut params: Vec<String> =
        dtypes.iter().enumerate().map(|(k, &d)| format!("const {}* __restrict__ in{k}", element_type(d))).collect();
    params.push(format!("{}* __restrict__ out0", element_type(out_dtype)));
    params.push("long long n".into());

    let mut c = String::new();
    let _ = writeln!(c, "// Generated by boundscope for `{}` over rows of {cols}: {layout:?}.", op.name());
    if dtypes.iter().chain([&out_dtype]).any(|&d| packing::is_packed(d)) {
        c.push_str(HALF_CONVERSIONS);
    }
    let _ = writeln!(c, "extern \"C\" __global__ void __launch_bounds__({block}) {kernel}({}) {{", params.join(", "));
    if t > 32 {
        let _ = writeln!(c, "  __shared__ float partial[{}];", t / 32);
    }
    open_rows(&mut c, t, rows, cols);
    load_row(&mut c, "xv", dtypes[0], shape, cols, 0);
    load_row(&mut c, "gv", dtypes[1], shape, cols, 1);
    row_statistics(&mut c, shape, cols, eps);
    let each = format!("for (int j = 0; j < {per_thread}; ++j) for (int e = 0; e < {v}; ++e)");
    let inverse = literal(1.0 / cols as f32);
    let sum = |a: &str, b: &str| format!("{a} + {b}");
    // `xv` becomes the normalised row, `gv` the gradient of it (times the weight).
    let _ = writeln!(c, "    {each} xv[j * {v} + e] = (xv[j * {v} + e] - mean) * inv_std;");
    if dtypes.len() == 3 {
        let _ = writeln!(c, "    #pragma unroll");
        let _ = writeln!(c, "    for (int j = 0; j < {per_thread}; ++j) {{");
        let _ = writeln!(c, "      const long long col = ((long long)j * {t} + lane) * {v};");
        let _ =
            writeln!(c, "      if (valid && col < {cols}ll) {{ float p[{v}]; {}", load(dtypes[2], v, "in2 + col", "p"));
        let _ = writeln!(c, "        for (int e = 0; e < {v}; ++e) gv[j * {v} + e] = gv[j * {v} + e] * p[e]; }}");
        let _ = writeln!(c, "    }}");
    }
    let _ = writeln!(c, "    acc = 0.0f;");
    let _ = writeln!(c, "    {each} acc = acc + gv[j * {v} + e];");
    row_reduce(&mut c, t, &sum);
    let _ = writeln!(c, "    const float dmean = acc * {inverse};");
    let _ = writeln!(c, "    acc = 0.0f;");
    let _ = writeln!(c, "    {each} acc = acc + gv[j * {v} + e] * xv[j * {v} + e];");
    row_reduce(&mut c, t, &sum);
    let _ = writeln!(c, "    const float dot_mean = acc * {inverse};");
    let _ = writeln!(c, "    #pragma unroll");
    let _ = writeln!(c, "    for (int j = 0; j < {per_thread}; ++j) {{");
    let _ = writeln!(c, "      const long long col = ((long long)j * {t} + lane) * {v};");
    let _ = writeln!(c, "      if (valid && col < {cols}ll) {{ float y[{v}];");
    let _ = writeln!(
        c,
        "        for (int e = 0; e < {v}; ++e) y[e] = ((gv[j * {v} + e] - dmean) - xv[j * {v} + e] * dot_mean) * inv_std;"
    );
    let _ = writeln!(c, "        {} }}", store(out_dtype, v, "out0 + row + col", "y"));
    let _ = writeln!(c, "    }}");
    let _ = writeln!(c, "  }}\n}}");
    let blocks = rows.div_ceil(layout.rows_per_block()).clamp(1, i32::MAX as usize) as u32;
    let source = RegionSource {
        kernel: kernel.to_string(),
        source: c,
        inputs: dtypes.len(),
        outputs: 1,
        numel,
        vectorized: v > 1,
        threads: blocks as usize * block,
        input_lengths: dtypes
            .iter()
            .enumerate()
            .map(|(k, &d)| packing::words(d, if k == 2 { cols } else { numel }))
            .collect(),
        output_lengths: vec![packing::words(out_dtype, numel)],
        in_place: Vec::new(),
        cluster: 1,
    };
    Ok(RowSource { source, layout, blocks, shared_bytes: layout.shared_bytes() })
}

/// A built-in `layer_norm_weight_backward(x, grad, eps)`: partial sums per block into a
/// scratch buffer of the run's stream, then their sum.
pub(crate) struct WeightBackward {
    device: Arc<CudaDevice>,
    partials: CudaFunction,
    total: CudaFunction,
    /// Blocks (and threads in each) of the partial sums.
    blocks: u32,
    block: u32,
    cols: usize,
    lengths: BufferLengths,
    scratch: Mutex<StreamWorkspaces>,
}

/// Outputs each block of the second kernel adds up (a warp's width).
const TOTALS_PER_BLOCK: usize = 32;

/// Threads that share each output's sum in the second kernel (each adds every `SHARE`th block).
const SHARE: usize = 8;

/// The two kernels of a `layer_norm_weight_backward` and their launch.
#[derive(Debug)]
pub(super) struct WeightSource {
    /// `{kernel}_partials(x, grad, partials)`: each block's sums per column.
    pub partials: String,
    /// `{kernel}_total(partials, out)`: their sum.
    pub total: String,
    pub blocks: usize,
    pub block: usize,
    pub rows: usize,
    pub cols: usize,
    pub dtypes: [DType; 2],
}

/// The kernels of a built-in `layer_norm_weight_backward(x, grad, eps)`, or why there are none.
pub(super) fn weight_source(op: &OpView<'_>, kernel: &str) -> std::result::Result<WeightSource, String> {
    if !runs_whole(op) || op.symbol().builtin_composite() != Some(prims::LAYER_NORM_WEIGHT_BACKWARD) {
        return Err(format!(
            "layer_norm_weight_backward runs whole for float x and a gradient of its shape, rows of at most \
             {MAX_WEIGHT_COLUMNS} that fit in registers"
        ));
    }
    let (rows, cols, dtypes) = operands(op).ok_or_else(|| "malformed operands".to_string())?;
    let eps = op.scalar(2).map_err(|e| e.to_string())?;
    let widest = dtypes.iter().map(|d| d.size_bytes()).max().unwrap_or(4);
    let layout = RowLayout::within(cols, widest, WEIGHT_VALUES);
    let per_thread = layout.per_thread.ok_or_else(|| format!("rows of {cols} are too long"))?;
    let RowLayout { threads_per_row: t, vector: v, block, .. } = layout;
    let shape = (t, v, per_thread);
    let blocks = rows.div_ceil(layout.rows_per_block()).clamp(1, MAX_WEIGHT_BLOCKS);
    let mut c = String::new();
    let _ = writeln!(c, "// Generated by boundscope for `{}` over rows of {cols}: {layout:?}.", op.name());
    if dtypes.iter().any(|&d| packing::is_packed(d)) {
        c.push_str(HALF_CONVERSIONS);
    }
    let (x, g) = (element_type(dtypes[0]), element_type(dtypes[1]));
    let _ = writeln!(
        c,
        "extern \"C\" __global__ void __launch_bounds__({block}) {kernel}_partials(const {x}* __restrict__ in0, \
         const {g}* __restrict__ in1, float* __restrict__ partials) {{"
    );
    let _ = writeln!(c, "  __shared__ float sums[{}];", 2 * cols);
    if t > 32 {
        let _ = writeln!(c, "  __shared__ float partial[{}];", t / 32);
    }
    let _ = writeln!(c, "  for (int i = threadIdx.x; i < {}; i += blockDim.x) sums[i] = 0.0f;", 2 * cols);
    let _ = writeln!(c, "  float sw[{0}], sb[{0}];", per_thread * v);
    let _ = writeln!(c, "  for (int i = 0; i < {}; ++i) {{ sw[i] = 0.0f; sb[i] = 0.0f; }}", per_thread * v);
    open_rows(&mut c, t, rows, cols);
    // Both rows loaded first, so that their reads are in flight together.
    load_row(&mut c, "xv", dtypes[0], shape, cols, 0);
    load_row(&mut c, "gv", dtypes[1], shape, cols, 1);
    row_statistics(&mut c, shape, cols, eps);
    // Past the row's end `gv` is 0, and past the last row nothing is added (there `inv_std`
    // may be infinite: `eps` 0 over a row of zeros).
    let _ = writeln!(c, "    if (valid) for (int i = 0; i < {}; ++i) {{", per_thread * v);
    let _ = writeln!(c, "      sw[i] = sw[i] + gv[i] * ((xv[i] - mean) * inv_std); sb[i] = sb[i] + gv[i]; }}");
    let _ = writeln!(c, "  }}");
    // The block's rows, added in a fixed order: the threads of row slot 0 first, then 1, ...
    let _ = writeln!(c, "  __syncthreads();");
    let _ = writeln!(c, "  for (int s = 0; s < {}; ++s) {{", layout.rows_per_block());
    let _ = writeln!(c, "    if (threadIdx.x / {t} == s) {{");
    let _ = writeln!(c, "      for (int j = 0; j < {per_thread}; ++j) for (int e = 0; e < {v}; ++e) {{");
    let _ = writeln!(c, "        const int col = (j * {t} + lane) * {v} + e;");
    let _ = writeln!(
        c,
        "        if (col < {cols}) {{ sums[col] += sw[j * {v} + e]; sums[{cols} + col] += sb[j * {v} + e]; }}"
    );
    let _ = writeln!(c, "      }}");
    let _ = writeln!(c, "    }}");
    let _ = writeln!(c, "    __syncthreads();");
    let _ = writeln!(c, "  }}");
    let _ = writeln!(
        c,
        "  for (int i = threadIdx.x; i < {0}; i += blockDim.x) partials[(long long)blockIdx.x * {0} + i] = sums[i];",
        2 * cols
    );
    let _ = writeln!(c, "}}");
    // The sum of the blocks' sums: `SHARE` threads per output, each adding every `SHARE`th
    // block in order, then the first adding the `SHARE` results in order.
    let partials_source = std::mem::take(&mut c);
    let _ = writeln!(
        c,
        "extern \"C\" __global__ void __launch_bounds__({}) {kernel}_total(const float* __restrict__ partials, \
         float* __restrict__ out0) {{",
        TOTALS_PER_BLOCK * SHARE
    );
    let _ = writeln!(c, "  __shared__ float shared[{SHARE}][{TOTALS_PER_BLOCK}];");
    let _ = writeln!(c, "  const int lane = threadIdx.x % {TOTALS_PER_BLOCK}, k = threadIdx.x / {TOTALS_PER_BLOCK};");
    let _ = writeln!(c, "  const int i = blockIdx.x * {TOTALS_PER_BLOCK} + lane;");
    let _ = writeln!(c, "  float acc = 0.0f;");
    let _ = writeln!(
        c,
        "  if (i < {0}) for (int b = k; b < {blocks}; b += {SHARE}) acc = acc + partials[(long long)b * {0} + i];",
        2 * cols
    );
    let _ = writeln!(c, "  shared[k][lane] = acc;");
    let _ = writeln!(c, "  __syncthreads();");
    let _ = writeln!(c, "  if (k == 0 && i < {}) {{", 2 * cols);
    let _ = writeln!(c, "    for (int s = 1; s < {SHARE}; ++s) acc = acc + shared[s][lane];");
    let _ = writeln!(c, "    out0[i] = acc;");
    let _ = writeln!(c, "  }}");
    let _ = writeln!(c, "}}");
    let total = c;
    Ok(WeightSource { partials: partials_source, total, blocks, block, rows, cols, dtypes: [dtypes[0], dtypes[1]] })
}

impl WeightBackward {
    pub(crate) fn new(device: &Arc<CudaDevice>, op: &OpView<'_>, kernel: &str) -> Result<Self> {
        let source = weight_source(op, kernel).map_err(|detail| Error::KernelPrecondition {
            executor: super::CudaOps::NAME.into(),
            symbol: op.name().into(),
            detail,
        })?;
        let WeightSource { rows, cols, dtypes, .. } = source;
        Ok(Self {
            device: device.clone(),
            partials: device.hand_launched(&format!("{kernel}_partials"), source.partials)?,
            total: device.hand_launched(&format!("{kernel}_total"), source.total)?,
            blocks: source.blocks as u32,
            block: source.block as u32,
            cols,
            lengths: BufferLengths {
                inputs: vec![packing::words(dtypes[0], rows * cols), packing::words(dtypes[1], rows * cols)],
                outputs: vec![packing::words(DType::F32, 2 * cols)],
            },
            scratch: Mutex::new(StreamWorkspaces::default()),
        })
    }
}

impl DeviceKernel for WeightBackward {
    fn run(&self, inputs: &[&dyn DeviceBuffer], outputs: &mut [&mut dyn DeviceBuffer]) -> Result<()> {
        self.lengths.check("layer_norm_weight_backward", inputs, outputs)?;
        let stream = self.device.stream();
        let mut scratch = self.scratch.lock().unwrap_or_else(|p| p.into_inner());
        let bytes = self.blocks as usize * 2 * self.cols * std::mem::size_of::<f32>();
        let mut partials: sys::CUdeviceptr = scratch.get(&stream, bytes)?.device_ptr(&stream).0;
        let mut x = address(inputs[0])?;
        let mut g = address(inputs[1])?;
        let mut out = address(&*outputs[0])?;
        let first = LaunchConfig { grid_dim: (self.blocks, 1, 1), block_dim: (self.block, 1, 1), shared_mem_bytes: 0 };
        let totals = (2 * self.cols).div_ceil(TOTALS_PER_BLOCK) as u32;
        let second = LaunchConfig {
            grid_dim: (totals, 1, 1),
            block_dim: ((TOTALS_PER_BLOCK * SHARE) as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the parameter lists are exactly the kernels' (three pointers; two), pointing
        // at values that outlive the calls; the inputs and the output hold what the kernels read
        // and write (checked above), the scratch `blocks` rows of `2 * cols` floats (its size),
        // written by the first kernel before the second reads it, in this stream's order (the
        // scratch is this stream's alone).
        unsafe {
            let mut params: [*mut c_void; 3] = [
                (&mut x as *mut sys::CUdeviceptr).cast(),
                (&mut g as *mut sys::CUdeviceptr).cast(),
                (&mut partials as *mut sys::CUdeviceptr).cast(),
            ];
            launch(&self.partials, &stream, first, &mut params)?;
            let mut params: [*mut c_void; 2] =
                [(&mut partials as *mut sys::CUdeviceptr).cast(), (&mut out as *mut sys::CUdeviceptr).cast()];
            launch(&self.total, &stream, second, &mut params)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::compiles_with_nvrtc as compiles;
    use super::*;
    use crate::core::ir::{Arena, Registry, TraceBuilder};
    use crate::TensorMeta;

    /// The last op of the trace `build` makes, viewed as an executor sees it, handed to `check`.
    fn with_op(build: impl Fn(&mut TraceBuilder<'_>) -> crate::ValueId, check: impl FnOnce(&OpView<'_>)) {
        let registry = Registry::with_builtins();
        let arena = Arena::new();
        let mut b = TraceBuilder::new(&arena, &registry);
        let y = build(&mut b);
        b.output(y).unwrap();
        let trace = b.finish().unwrap();
        let bsym = trace.bound_symbols().last().unwrap();
        check(&OpView::new(&trace, bsym).unwrap());
    }

    fn input(b: &mut TraceBuilder<'_>, dtype: DType, shape: &[usize]) -> crate::ValueId {
        b.input_with(&TensorMeta::new(dtype, shape)).unwrap()
    }

    /// Every shape class: short rows (several per warp), GPT-2's 768, odd lengths (narrow
    /// accesses), rows split over warps of a block, and mixed dtypes.
    const CASES: [(DType, DType, &[usize]); 6] = [
        (DType::BF16, DType::BF16, &[64, 768]),
        (DType::F32, DType::F32, &[3, 5, 32]),
        (DType::F16, DType::F32, &[7, 1001]),
        (DType::F32, DType::F32, &[2, 4096]),
        (DType::BF16, DType::F32, &[9, 3]),
        (DType::F32, DType::F32, &[1, 1]),
    ];

    #[test]
    fn the_input_gradient_is_one_row_kernel_reading_each_row_once() {
        for (dtype, weight_dtype, shape) in CASES {
            with_op(
                |b| {
                    let x = input(b, dtype, shape);
                    let g = input(b, dtype, shape);
                    let w = input(b, weight_dtype, &shape[shape.len() - 1..]);
                    b.layer_norm_backward(x, g, 1e-5, Some(w)).unwrap()
                },
                |op| {
                    assert!(runs_whole(op), "{shape:?}");
                    let generated = input_source(op, "k").unwrap();
                    let src = &generated.source.source;
                    // One load site each for x and the gradient, one for the weight, one store.
                    for array in ["in0 + row + col", "in1 + row + col", "in2 + col"] {
                        assert_eq!(src.matches(array).count(), 1, "{array} in\n{src}");
                    }
                    assert_eq!(src.matches("out0 + row + col").count(), 1, "{src}");
                    assert!(src.contains("expf(logf(variance + "), "{src}");
                    let numel: usize = shape.iter().product();
                    assert_eq!(generated.source.output_lengths, vec![packing::words(dtype, numel)]);
                    compiles(src);
                },
            );
        }
    }

    #[test]
    fn the_weight_gradients_are_partial_sums_per_block_then_their_sum() {
        for (dtype, _, shape) in CASES {
            with_op(
                |b| {
                    let x = input(b, dtype, shape);
                    let g = input(b, dtype, shape);
                    b.layer_norm_weight_backward(x, g, 1e-5).unwrap()
                },
                |op| {
                    assert!(runs_whole(op), "{shape:?}");
                    let generated = weight_source(op, "k").unwrap();
                    let rows: usize = shape[..shape.len() - 1].iter().product();
                    assert!(generated.blocks >= 1 && generated.blocks <= MAX_WEIGHT_BLOCKS.min(rows.max(1)));
                    assert!(generated.partials.contains("k_partials(") && generated.total.contains("k_total("));
                    compiles(&generated.partials);
                    compiles(&generated.total);
                },
            );
        }
    }

    #[test]
    fn rows_too_long_for_registers_or_shared_memory_or_empty_decompose() {
        with_op(
            |b| {
                let x = input(b, DType::F32, &[2, 0]);
                b.layer_norm_weight_backward(x, x, 1e-5).unwrap()
            },
            |op| assert!(!runs_whole(op), "rows of no values"),
        );
        with_op(
            |b| {
                let x = input(b, DType::F32, &[2, MAX_WEIGHT_COLUMNS + 4]);
                b.layer_norm_weight_backward(x, x, 1e-5).unwrap()
            },
            |op| {
                assert!(!runs_whole(op));
                assert!(weight_source(op, "k").unwrap_err().contains("at most"));
            },
        );
        with_op(
            |b| {
                let x = input(b, DType::F32, &[2, 1 << 16]);
                b.layer_norm_backward(x, x, 1e-5, None).unwrap()
            },
            |op| {
                assert!(!runs_whole(op));
                assert!(input_source(op, "k").unwrap_err().contains("registers"));
            },
        );
    }
}
