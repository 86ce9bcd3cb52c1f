//! `cross_entropy(logits, targets)` whole on the GPU: one block per row reads the row once,
//! keeping a running maximum and sum of exponentials (each thread its own, then combined across
//! the block), and writes the row's loss `log(sum(exp(x))) - x[target]`; a second, one-block
//! kernel adds the rows' losses in a fixed order and writes their mean in the result's dtype
//! (`f32`). Where the decomposition writes the `[rows, classes]` log-probabilities and
//! reads them back several times, this reads the logits once. Targets are checked on the device
//! as the gathers check their ids ([`gather`](super::gather)): a target out of range is
//! [`Error::IndexOutOfRange`] from the run that queued it.
//!
//! `cross_entropy_backward` is one kernel too: a block per row finds the row's maximum and sum
//! of exponentials as the forward does, then writes `(exp(x - m) / z - [j == target]) grad /
//! rows` in the logits' dtype, in 16-byte vectors (the row read twice and written once, where
//! the decomposition writes and reads `[rows, classes]` tensors in `f32` several times).

use std::ffi::c_void;
use std::fmt::Write;
use std::sync::Arc;

use cudarc::driver::{sys, CudaFunction, CudaSlice, DevicePtrMut, LaunchConfig};

use super::codegen::{element_type, narrow, widen, HALF_CONVERSIONS};
use super::device::{address, cuda_error, CudaDevice};
use super::device_checks::{launch, record_fault, BufferLengths, PerStream};
use crate::core::ir::{prims, DType};
use crate::core::plan::{packing, DeviceBuffer, DeviceKernel, OpView};
use crate::error::{Error, Result};

/// Threads per block of both kernels.
const THREADS: u32 = 256;

/// Whether CudaOps runs this `cross_entropy` whole: float logits `[rows, classes]`, integer
/// targets `[rows]`.
pub(crate) fn runs_whole(op: &OpView<'_>) -> bool {
    let tensors: Vec<_> = op.bound_symbol().inputs().collect();
    op.symbol().builtin_composite() == Some(prims::CROSS_ENTROPY)
        && tensors.len() == 2
        && op.dtype_of(tensors[0]).is_float()
        && op.dtype_of(tensors[1]).is_integer()
        && matches!((op.input_shape(0), op.input_shape(1)), (Ok([r, _]), Ok([n])) if r == n)
}

/// Whether CudaOps runs this `cross_entropy_backward` whole: float logits `[rows, classes]`,
/// integer targets `[rows]`, a float gradient of one element.
pub(crate) fn runs_backward_whole(op: &OpView<'_>) -> bool {
    let tensors: Vec<_> = op.bound_symbol().inputs().collect();
    op.symbol().builtin_composite() == Some(prims::CROSS_ENTROPY_BACKWARD)
        && tensors.len() == 3
        && op.dtype_of(tensors[0]).is_float()
        && op.dtype_of(tensors[1]).is_integer()
        && op.dtype_of(tensors[2]).is_float()
        && matches!((op.input_shape(0), op.input_shape(1)), (Ok([r, _]), Ok([n])) if r == n)
        && op.input_shape(2).is_ok_and(|g| g.iter().product::<usize>() == 1)
}

/// The launch of a kernel that takes a block per row (at most 2^20 blocks; each loops).
fn per_row(rows: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: ((rows.min(1 << 20) as u32).max(1), 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// `cross_entropy_backward` whole: one kernel, a block per row (see [`backward_source`]).
pub(crate) struct CrossEntropyBackward {
    device: Arc<CudaDevice>,
    kernel: CudaFunction,
    rows: usize,
    classes: usize,
    lengths: BufferLengths,
    /// Per stream: the fault buffer.
    faults: PerStream<()>,
}

impl CrossEntropyBackward {
    pub(crate) fn new(device: &Arc<CudaDevice>, op: &OpView<'_>, kernel: &str) -> Result<Self> {
        if !runs_backward_whole(op) {
            return Err(Error::KernelPrecondition {
                executor: super::CudaOps::NAME.into(),
                symbol: op.name().into(),
                detail: "cross_entropy_backward runs whole for float logits [rows, classes], integer targets [rows] \
                         and a float gradient of one element"
                    .into(),
            });
        }
        let tensors: Vec<_> = op.bound_symbol().inputs().collect();
        let (dtype, target_dtype, grad_dtype) =
            (op.dtype_of(tensors[0]), op.dtype_of(tensors[1]), op.dtype_of(tensors[2]));
        let logits = op.input_shape(0)?;
        let (rows, classes) = (logits[0], logits[1]);
        let source = backward_source(kernel, dtype, target_dtype, grad_dtype, classes);
        Ok(Self {
            device: device.clone(),
            kernel: device.hand_launched(kernel, source)?,
            rows,
            classes,
            lengths: BufferLengths {
                inputs: vec![
                    packing::words(dtype, rows * classes),
                    packing::words(target_dtype, rows),
                    packing::words(grad_dtype, 1),
                ],
                outputs: vec![packing::words(dtype, rows * classes)],
            },
            faults: PerStream::new(),
        })
    }
}

impl DeviceKernel for CrossEntropyBackward {
    fn run(&self, inputs: &[&dyn DeviceBuffer], outputs: &mut [&mut dyn DeviceBuffer]) -> Result<()> {
        self.lengths.check("cross_entropy_backward", inputs, outputs)?;
        if self.rows == 0 {
            return Ok(());
        }
        let stream = self.device.stream();
        self.faults.with(
            &stream,
            |_| Ok(()),
            |fault, ()| {
                let mut rows = self.rows as i64;
                let mut logits = address(inputs[0])?;
                let mut targets = address(inputs[1])?;
                let mut grad = address(inputs[2])?;
                let mut out = address(&*outputs[0])?;
                let mut fault_ptr: sys::CUdeviceptr = fault.device_ptr_mut(&stream).0;
                // SAFETY: the parameter list is exactly the kernel's (five pointers, then `long long
                // rows`), pointing at values that outlive the call; the buffers hold what it reads
                // and writes (checked above; the targets are checked on the device before any
                // read at them).
                unsafe {
                    let mut params: [*mut c_void; 6] = [
                        (&mut logits as *mut sys::CUdeviceptr).cast(),
                        (&mut targets as *mut sys::CUdeviceptr).cast(),
                        (&mut grad as *mut sys::CUdeviceptr).cast(),
                        (&mut out as *mut sys::CUdeviceptr).cast(),
                        (&mut fault_ptr as *mut sys::CUdeviceptr).cast(),
                        (&mut rows as *mut i64).cast(),
                    ];
                    launch(&self.kernel, &stream, per_row(self.rows), &mut params)
                }
            },
        )
    }

    fn checks_after_run(&self) -> bool {
        true
    }

    fn check_after_run(&self) -> Result<()> {
        self.faults.check(&self.device.stream(), "cross_entropy_backward", self.classes)
    }
}

pub(crate) struct CrossEntropy {
    device: Arc<CudaDevice>,
    rows_kernel: CudaFunction,
    mean_kernel: CudaFunction,
    rows: usize,
    classes: usize,
    lengths: BufferLengths,
    /// Per stream: the fault buffer, and the rows' losses.
    scratch: PerStream<CudaSlice<f32>>,
}

impl CrossEntropy {
    pub(crate) fn new(device: &Arc<CudaDevice>, op: &OpView<'_>, kernel: &str) -> Result<Self> {
        if !runs_whole(op) {
            return Err(Error::KernelPrecondition {
                executor: super::CudaOps::NAME.into(),
                symbol: op.name().into(),
                detail: "cross_entropy runs whole for float logits [rows, classes] and integer targets [rows]".into(),
            });
        }
        let tensors: Vec<_> = op.bound_symbol().inputs().collect();
        let (dtype, target_dtype) = (op.dtype_of(tensors[0]), op.dtype_of(tensors[1]));
        let out_dtype = op.dtype_of(op.bound_symbol().outputs()[0]);
        let logits = op.input_shape(0)?;
        let (rows, classes) = (logits[0], logits[1]);
        let function = |name: String, source: String| device.hand_launched(&name, source);
        let rows_name = format!("{kernel}_rows");
        let mean_name = format!("{kernel}_mean");
        Ok(Self {
            device: device.clone(),
            rows_kernel: function(rows_name.clone(), rows_source(&rows_name, dtype, target_dtype, classes))?,
            mean_kernel: function(mean_name.clone(), mean_source(&mean_name, out_dtype))?,
            rows,
            classes,
            lengths: BufferLengths {
                inputs: vec![packing::words(dtype, rows * classes), packing::words(target_dtype, rows)],
                outputs: vec![packing::words(out_dtype, 1)],
            },
            scratch: PerStream::new(),
        })
    }
}

/// The CUDA C that leaves, in every thread of a block, the maximum `m` of the row `row` (of
/// `classes` values of `dtype`) and the sum `z` of `exp(x - m)` over it (both NaN where the row
/// holds a NaN), reading the row once in 16-byte vectors (the scalar head before the row's
/// first 16-byte boundary and the tail after its last are `head` and `tail`). Declares `m`,
/// `z`, `head`, `vectors` and `tail`; needs `shared_m` and `shared_z` of a float per warp.
fn row_statistics(dtype: DType, classes: usize) -> String {
    let x = |at: &str| widen(dtype, &format!("row[{at}]"));
    let per_vector = 16 / dtype.size_bytes();
    let mut s = String::new();
    let _ = writeln!(s, "    float m = BS_NEG_INF, z = 0.0f; bool nan = false;");
    // Elements before the row's first 16-byte boundary, whole vectors, and the rest.
    let _ = writeln!(
        s,
        "    long long head = (long long)(((16u - ((unsigned int)(unsigned long long)row & 15u)) & 15u) / {});",
        dtype.size_bytes()
    );
    let _ = writeln!(s, "    if (head > {classes}ll) head = {classes}ll;");
    let _ = writeln!(s, "    const long long vectors = ({classes}ll - head) / {per_vector};");
    let _ = writeln!(s, "    const long long tail = head + vectors * {per_vector};");
    let scalar_step = "{ nan |= (v != v); if (v > m) { z = z * expf(m - v); m = v; } \
                       if (m != BS_NEG_INF) z += expf(v - m); }";
    let _ = writeln!(s, "    for (long long j = threadIdx.x; j < head; j += {THREADS}) {{");
    let _ = writeln!(s, "      const float v = {}; {scalar_step}", x("j"));
    let _ = writeln!(s, "    }}");
    let _ = writeln!(s, "    const uint4* vrow = (const uint4*)(row + head);");
    let _ = writeln!(s, "    for (long long i = threadIdx.x; i < vectors; i += {THREADS}) {{");
    let _ = writeln!(s, "      const uint4 raw = __ldg(vrow + i);");
    let _ = writeln!(s, "      const unsigned int w[4] = {{raw.x, raw.y, raw.z, raw.w}};");
    let _ = writeln!(s, "      const float v[{per_vector}] = {{{}}};", unpack(dtype).join(", "));
    let _ = writeln!(s, "      float top = v[0];");
    let _ = writeln!(s, "      #pragma unroll");
    let _ = writeln!(
        s,
        "      for (int k = 0; k < {per_vector}; ++k) {{ nan |= (v[k] != v[k]); top = fmaxf(top, v[k]); }}"
    );
    let _ = writeln!(s, "      if (top > m) {{ z = z * expf(m - top); m = top; }}");
    let _ = writeln!(s, "      if (m != BS_NEG_INF) {{");
    let _ = writeln!(s, "        #pragma unroll");
    let _ = writeln!(s, "        for (int k = 0; k < {per_vector}; ++k) z += expf(v[k] - m);");
    let _ = writeln!(s, "      }}");
    let _ = writeln!(s, "    }}");
    let _ = writeln!(s, "    for (long long j = tail + threadIdx.x; j < {classes}ll; j += {THREADS}) {{");
    let _ = writeln!(s, "      const float v = {}; {scalar_step}", x("j"));
    let _ = writeln!(s, "    }}");
    // A warp merges its lanes' pairs with shuffles, then the first warp the warps' pairs, and
    // the first thread hands the row's pair to the others.
    let merge_warp = "for (int o = 16; o > 0; o >>= 1) { \
                      const float m2 = __shfl_xor_sync(0xffffffffu, m, o), z2 = __shfl_xor_sync(0xffffffffu, z, o); \
                      nan |= __shfl_xor_sync(0xffffffffu, (int)nan, o) != 0; bs_merge(m, z, m2, z2); }";
    let _ = writeln!(s, "    {merge_warp}");
    let _ = writeln!(s, "    if (nan) {{ m = __int_as_float(0x7fc00000); z = m; }}");
    let _ = writeln!(
        s,
        "    if ((threadIdx.x & 31) == 0) {{ shared_m[threadIdx.x / 32] = m; shared_z[threadIdx.x / 32] = z; }}"
    );
    let _ = writeln!(s, "    __syncthreads();");
    let _ = writeln!(s, "    if (threadIdx.x < 32) {{");
    let _ = writeln!(s, "      const bool here = threadIdx.x < {};", THREADS / 32);
    let _ =
        writeln!(s, "      m = here ? shared_m[threadIdx.x] : BS_NEG_INF; z = here ? shared_z[threadIdx.x] : 0.0f;");
    let _ = writeln!(s, "      nan = m != m;");
    let _ = writeln!(s, "      {merge_warp}");
    let _ = writeln!(s, "      if (nan) {{ m = __int_as_float(0x7fc00000); z = m; }}");
    let _ = writeln!(s, "    }}");
    let _ = writeln!(s, "    __syncthreads();");
    let _ = writeln!(s, "    if (threadIdx.x == 0) {{ shared_m[0] = m; shared_z[0] = z; }}");
    let _ = writeln!(s, "    __syncthreads();");
    let _ = writeln!(s, "    m = shared_m[0]; z = shared_z[0];");
    s
}

/// Each of a 16-byte vector's values as `float`, from the vector's words `w`.
fn unpack(dtype: DType) -> Vec<String> {
    (0..16 / dtype.size_bytes())
        .map(|i| match dtype.size_bytes() {
            2 => widen(dtype, &format!("(w[{}] {})", i / 2, if i % 2 == 0 { "& 0xffffu" } else { ">> 16" })),
            _ => format!("__uint_as_float(w[{i}])"),
        })
        .collect()
}

/// The kernel preamble both kernels share: 16-bit conversions, and the merge of two running
/// (maximum, sum) pairs.
fn preamble(s: &mut String, dtype: DType, grad_dtype: DType) {
    if packing::is_packed(dtype) || packing::is_packed(grad_dtype) {
        s.push_str(HALF_CONVERSIONS);
    }
    s.push_str(
        "#define BS_NEG_INF __int_as_float(0xff800000)\n\
         __device__ __forceinline__ void bs_merge(float& m, float& z, float m2, float z2) {\n  \
         if (m2 == BS_NEG_INF) return;\n  \
         if (m == BS_NEG_INF) { m = m2; z = z2; return; }\n  \
         const float top = fmaxf(m, m2);\n  \
         z = z * expf(m - top) + z2 * expf(m2 - top); m = top;\n}\n",
    );
}

fn rows_source(kernel: &str, dtype: DType, target_dtype: DType, classes: usize) -> String {
    let (element, target) = (element_type(dtype), element_type(target_dtype));
    let x = |at: &str| widen(dtype, &format!("row[{at}]"));
    let mut s = String::new();
    let _ = writeln!(s, "// Generated by boundscope: cross_entropy's rows, {classes} classes each.");
    preamble(&mut s, dtype, dtype);
    let _ = writeln!(
        s,
        "extern \"C\" __global__ void {kernel}(const {element}* __restrict__ logits, const {target}* __restrict__ \
         targets, float* __restrict__ losses, unsigned int* fault, long long rows) {{"
    );
    let _ = writeln!(s, "  __shared__ float shared_m[{}], shared_z[{}];", THREADS / 32, THREADS / 32);
    let _ = writeln!(s, "  for (long long r = blockIdx.x; r < rows; r += gridDim.x) {{");
    let _ = writeln!(s, "    const {element}* row = logits + r * {classes}ll;");
    s.push_str(&row_statistics(dtype, classes));
    let _ = writeln!(s, "    if (threadIdx.x == 0) {{");
    let _ = writeln!(s, "      const long long id = (long long)targets[r];");
    let _ = writeln!(s, "      if (id < 0 || id >= {classes}ll) {{");
    let _ = writeln!(s, "        {}", record_fault("r", "id"));
    let _ = writeln!(s, "        losses[r] = __int_as_float(0x7fc00000);");
    let _ = writeln!(s, "      }} else {{");
    let _ = writeln!(s, "        losses[r] = m + logf(z) - {};", x("id"));
    let _ = writeln!(s, "      }}");
    let _ = writeln!(s, "    }}");
    let _ = writeln!(s, "    __syncthreads();");
    let _ = writeln!(s, "  }}\n}}");
    s
}

/// `cross_entropy_backward`: per row, the statistics as the forward's, then each value
/// `(exp(x - m) / z - [j == target]) grad / rows` written in the logits' dtype, in 16-byte
/// vectors (the output's rows are aligned as the logits' are: same element size and offsets).
fn backward_source(kernel: &str, dtype: DType, target_dtype: DType, grad_dtype: DType, classes: usize) -> String {
    let (element, target, grad) = (element_type(dtype), element_type(target_dtype), element_type(grad_dtype));
    let x = |at: &str| widen(dtype, &format!("row[{at}]"));
    let per_vector = 16 / dtype.size_bytes();
    let value = |v: &str, j: &str| format!("(expf({v} - m) * inv - (({j}) == id ? 1.0f : 0.0f)) * scale");
    let mut s = String::new();
    let _ = writeln!(s, "// Generated by boundscope: cross_entropy_backward, {classes} classes a row.");
    preamble(&mut s, dtype, grad_dtype);
    let _ = writeln!(
        s,
        "extern \"C\" __global__ void {kernel}(const {element}* __restrict__ logits, const {target}* __restrict__ \
         targets, const {grad}* __restrict__ grad, {element}* __restrict__ out, unsigned int* fault, long long rows) {{"
    );
    let _ = writeln!(s, "  __shared__ float shared_m[{}], shared_z[{}];", THREADS / 32, THREADS / 32);
    let _ = writeln!(s, "  const float scale = {} / (float)rows;", widen(grad_dtype, "grad[0]"));
    let _ = writeln!(s, "  for (long long r = blockIdx.x; r < rows; r += gridDim.x) {{");
    let _ = writeln!(s, "    const {element}* row = logits + r * {classes}ll;");
    let _ = writeln!(s, "    {element}* orow = out + r * {classes}ll;");
    s.push_str(&row_statistics(dtype, classes));
    let _ = writeln!(s, "    long long id = (long long)targets[r];");
    let _ = writeln!(s, "    if (id < 0 || id >= {classes}ll) {{");
    let _ = writeln!(s, "      if (threadIdx.x == 0) {{ {} }}", record_fault("r", "id"));
    let _ = writeln!(s, "      id = -1;");
    let _ = writeln!(s, "    }}");
    let _ = writeln!(s, "    const float inv = 1.0f / z;");
    let scalar_store = |from: &str, to: &str| {
        format!(
            "    for (long long j = {from} + threadIdx.x; j < {to}; j += {THREADS}) orow[j] = {};\n",
            narrow(dtype, &value(&x("j"), "j"))
        )
    };
    s.push_str(&scalar_store("0", "head"));
    let _ = writeln!(s, "    uint4* vout = (uint4*)(orow + head);");
    let _ = writeln!(s, "    for (long long i = threadIdx.x; i < vectors; i += {THREADS}) {{");
    let _ = writeln!(s, "      const uint4 raw = __ldg(vrow + i);");
    let _ = writeln!(s, "      const unsigned int w[4] = {{raw.x, raw.y, raw.z, raw.w}};");
    let _ = writeln!(s, "      const float v[{per_vector}] = {{{}}};", unpack(dtype).join(", "));
    let _ = writeln!(s, "      const long long j0 = head + i * {per_vector};");
    let _ = writeln!(s, "      float d[{per_vector}];");
    let _ = writeln!(s, "      #pragma unroll");
    let _ = writeln!(s, "      for (int k = 0; k < {per_vector}; ++k) d[k] = {};", value("v[k]", "j0 + k"));
    let words: Vec<String> = (0..4)
        .map(|i| match dtype.size_bytes() {
            2 => {
                let to = if dtype == DType::BF16 { "bs_to_bf16" } else { "bs_to_f16" };
                format!("{to}(d[{}]) | ({to}(d[{}]) << 16)", 2 * i, 2 * i + 1)
            }
            _ => format!("__float_as_uint(d[{i}])"),
        })
        .collect();
    let _ = writeln!(s, "      vout[i] = make_uint4({});", words.join(", "));
    let _ = writeln!(s, "    }}");
    s.push_str(&scalar_store("tail", &format!("{classes}ll")));
    let _ = writeln!(s, "    __syncthreads();");
    let _ = writeln!(s, "  }}\n}}");
    s
}

fn mean_source(kernel: &str, out_dtype: DType) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "// Generated by boundscope: the mean of cross_entropy's row losses, in a fixed order.");
    if packing::is_packed(out_dtype) {
        s.push_str(HALF_CONVERSIONS);
    }
    let _ = writeln!(
        s,
        "extern \"C\" __global__ void {kernel}(const float* __restrict__ losses, {}* __restrict__ out, long long rows) {{",
        element_type(out_dtype)
    );
    let _ = writeln!(s, "  __shared__ float partial[{THREADS}];");
    let _ = writeln!(s, "  float sum = 0.0f;");
    let _ = writeln!(s, "  for (long long r = threadIdx.x; r < rows; r += {THREADS}) sum += losses[r];");
    let _ = writeln!(s, "  partial[threadIdx.x] = sum;");
    let _ = writeln!(s, "  __syncthreads();");
    let _ = writeln!(s, "  for (int half = {}; half > 0; half >>= 1) {{", THREADS / 2);
    let _ = writeln!(s, "    if (threadIdx.x < half) partial[threadIdx.x] += partial[threadIdx.x + half];");
    let _ = writeln!(s, "    __syncthreads();");
    let _ = writeln!(s, "  }}");
    let _ = writeln!(s, "  if (threadIdx.x == 0) out[0] = {};", narrow(out_dtype, "partial[0] / (float)rows"));
    let _ = writeln!(s, "}}");
    s
}

impl DeviceKernel for CrossEntropy {
    fn run(&self, inputs: &[&dyn DeviceBuffer], outputs: &mut [&mut dyn DeviceBuffer]) -> Result<()> {
        self.lengths.check("cross_entropy", inputs, outputs)?;
        let stream = self.device.stream();
        let rows_count = self.rows.max(1);
        let make = |stream: &Arc<cudarc::driver::CudaStream>| {
            stream.alloc_zeros::<f32>(rows_count).map_err(|e| cuda_error("row losses", e))
        };
        self.scratch.with(&stream, make, |fault, losses| {
            let mut rows = self.rows as i64;
            let mut logits = address(inputs[0])?;
            let mut targets = address(inputs[1])?;
            let mut losses_ptr: sys::CUdeviceptr = losses.device_ptr_mut(&stream).0;
            let mut fault_ptr: sys::CUdeviceptr = fault.device_ptr_mut(&stream).0;
            let mut out = address(&*outputs[0])?;
            // SAFETY: each parameter list is exactly its kernel's (pointers, then `long long
            // rows`), pointing at values that outlive the calls; the buffers hold what the
            // kernels read and write (checked above; the targets are checked on the device
            // before any read at them).
            unsafe {
                let mut params: [*mut c_void; 5] = [
                    (&mut logits as *mut sys::CUdeviceptr).cast(),
                    (&mut targets as *mut sys::CUdeviceptr).cast(),
                    (&mut losses_ptr as *mut sys::CUdeviceptr).cast(),
                    (&mut fault_ptr as *mut sys::CUdeviceptr).cast(),
                    (&mut rows as *mut i64).cast(),
                ];
                launch(&self.rows_kernel, &stream, per_row(self.rows), &mut params)?;
                let mut params: [*mut c_void; 3] = [
                    (&mut losses_ptr as *mut sys::CUdeviceptr).cast(),
                    (&mut out as *mut sys::CUdeviceptr).cast(),
                    (&mut rows as *mut i64).cast(),
                ];
                launch(&self.mean_kernel, &stream, per_row(1), &mut params)
            }
        })
    }

    fn checks_after_run(&self) -> bool {
        true
    }

    fn check_after_run(&self) -> Result<()> {
        self.scratch.check(&self.device.stream(), "cross_entropy", self.classes)
    }
}
