//! Matrix products through cuBLASLt, planned when the plan is compiled: `matmul`, and `linear`
//! as one product that reads the weight transposed (an operation flag, not a copy) and adds the
//! bias in its epilogue, where the decomposition takes a transpose, a product and an add;
//! `linear_gelu` applies GELU in the same epilogue.
//!
//! Descriptors, layouts and the algorithm (cuBLASLt's heuristic, with a 32 MiB workspace) are
//! made once per bound symbol; a run sets the bias pointer and calls `cublasLtMatmul` on the
//! stream of its workspace, with a workspace buffer of that stream's own, so that runs on
//! several streams never share one. Compute is FP32 (`CUBLAS_COMPUTE_32F`: no TF32).
//!
//! cuBLASLt's fast 16-bit kernels want every dimension a multiple of 8: GPT-2's 50,257-word
//! vocabulary makes its LM head's products 5-8 times slower (on the H200 6.7 ms against 0.88
//! ms for 50,304 words; PyTorch's `matmul` alike). Large 16-bit products with such a dimension
//! are padded, as `torch.compile`'s `pad_mm` does: each operand whose shape changes is copied
//! into a scratch buffer (one per stream) with zeros around it, and the result is computed
//! there and copied out.

use std::ffi::c_void;
use std::sync::{Arc, Mutex};

use cudarc::cublaslt::{result, sys};
use cudarc::driver::DevicePtr;

use super::device::{address, cuda_error, CudaDevice};
use super::stream_workspaces::StreamWorkspaces;
use crate::core::plan::{DeviceBuffer, DeviceKernel};
use crate::error::Result;

/// cuBLASLt's workspace per stream: what NVIDIA recommends for Hopper.
const WORKSPACE_BYTES: usize = 32 << 20;

/// What a product computes, row-major: `c[m, n] = a[m, k] · b` with `b` stored `[k, n]`
/// (`matmul`) or `[n, k]` (`linear`, read transposed), plus `bias[n]` on every row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct GemmShape {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    /// `b` is stored `[n, k]` and read transposed.
    pub b_transposed: bool,
    /// `a` is stored `[k, m]` and read transposed (`transposed_matmul`).
    pub a_transposed: bool,
    /// A bias of `n` elements is the third input.
    pub bias: bool,
    /// GELU (tanh form) applied to the result in the epilogue, after the bias.
    pub gelu: bool,
    /// The dtype of every operand (bf16 and f16 products accumulate in `f32`).
    pub dtype: crate::DType,
    /// Products in the batch (1 for a 2-D product): one strided batched call.
    pub batch: usize,
    /// Whether `a` holds one matrix per batch index (else one, read by every product).
    pub a_batched: bool,
    /// Whether `b` holds one matrix per batch index (else one, read by every product).
    pub b_batched: bool,
}

impl GemmShape {
    /// A product of one pair of matrices.
    pub fn single(m: usize, n: usize, k: usize, dtype: crate::DType) -> Self {
        Self {
            m,
            n,
            k,
            b_transposed: false,
            a_transposed: false,
            bias: false,
            gelu: false,
            dtype,
            batch: 1,
            a_batched: false,
            b_batched: false,
        }
    }
}

/// One cuBLASLt handle per executor, and the workspace buffers of the streams it ran on.
pub(crate) struct LtContext {
    handle: sys::cublasLtHandle_t,
    /// One workspace per live stream, made on its first product.
    workspaces: StreamWorkspaces,
    /// One buffer per live stream for staged operands (see the module's documentation), made
    /// (or grown) on the first product that stages one.
    staging: StreamWorkspaces,
}

// SAFETY: the handle and buffers are only used under the executor's mutex.
unsafe impl Send for LtContext {}

impl LtContext {
    /// A handle for `device`'s context, which this thread binds first: `cublasLtCreate` reads
    /// the current context's limits (compute-sanitizer reports the call as an error when the
    /// plan is compiled on a thread with none bound).
    pub fn new(device: &CudaDevice) -> Result<Self> {
        device.context().bind_to_thread().map_err(|e| cuda_error("bind the CUDA context", e))?;
        let handle = result::create_handle().map_err(|e| cuda_error("cublasLtCreate", e))?;
        Ok(Self { handle, workspaces: StreamWorkspaces::default(), staging: StreamWorkspaces::default() })
    }
}

impl Drop for LtContext {
    fn drop(&mut self) {
        // SAFETY: the handle was created by `new` and is destroyed once.
        unsafe {
            let _ = result::destroy_handle(self.handle);
        }
    }
}

/// The descriptors of one product, made when the plan is compiled.
struct Descriptors {
    desc: sys::cublasLtMatmulDesc_t,
    a: sys::cublasLtMatrixLayout_t,
    b: sys::cublasLtMatrixLayout_t,
    c: sys::cublasLtMatrixLayout_t,
    algo: sys::cublasLtMatmulAlgo_t,
}

// SAFETY: host descriptors, only used under the product's mutex.
unsafe impl Send for Descriptors {}

impl Drop for Descriptors {
    fn drop(&mut self) {
        // SAFETY: each non-null one was created once by `LtGemm::new` and is destroyed once.
        unsafe {
            if !self.desc.is_null() {
                let _ = result::destroy_matmul_desc(self.desc);
            }
            for layout in [self.a, self.b, self.c] {
                if !layout.is_null() {
                    let _ = result::destroy_matrix_layout(layout);
                }
            }
        }
    }
}

/// A planned product: a device kernel of the CUDA executors.
pub(crate) struct LtGemm {
    device: Arc<CudaDevice>,
    context: Arc<Mutex<Option<LtContext>>>,
    descriptors: Mutex<Descriptors>,
    shape: GemmShape,
    name: &'static str,
    /// The padded operands (`a`, `b`, the result, the bias), and the kernel that copies them.
    staged: [Option<Staged>; 4],
    repitch: Option<cudarc::driver::CudaFunction>,
}

/// One padded operand: `matrices` matrices of `rows` x `width` elements, held in the scratch
/// buffer as `padded_rows` x `padded_width` (zeros around) from element `offset` on.
#[derive(Clone, Copy, Debug)]
struct Staged {
    matrices: usize,
    rows: usize,
    width: usize,
    padded_rows: usize,
    padded_width: usize,
    offset: usize,
}

impl Staged {
    fn elements(&self) -> usize {
        self.matrices * self.padded_rows * self.padded_width
    }
}

/// Padded dimensions are multiples of this (16 bytes of 16-bit values).
const ALIGN_ELEMENTS: usize = 8;

/// Whether a product of `shape` is padded: 16-bit, a dimension not a multiple of 8, and every
/// dimension at least 256 (so that the copies cost little beside the product).
fn padded(shape: &GemmShape) -> bool {
    let dims = [shape.m, shape.n, shape.k];
    shape.dtype.size_bytes() == 2
        && dims.iter().any(|d| !d.is_multiple_of(ALIGN_ELEMENTS))
        && dims.iter().all(|&d| d >= 256)
}

/// The staging of `matrices` matrices of `rows` x `width` padded to `padded_rows` x
/// `padded_width`, placed at `*next` (then moved past it, to a 256-byte boundary); `None` where
/// nothing changes.
fn staged(matrices: usize, (rows, width): (usize, usize), padded: (usize, usize), next: &mut usize) -> Option<Staged> {
    if (rows, width) == padded {
        return None;
    }
    let (padded_rows, padded_width) = padded;
    let staged = Staged { matrices, rows, width, padded_rows, padded_width, offset: *next };
    *next = (*next + staged.elements()).div_ceil(128) * 128;
    Some(staged)
}

/// Copies `matrices` matrices of `rows` x `width` 16-bit elements from `src` (each with its row
/// pitch and matrix stride) to the dense `dst` of `matrices` x `fill_rows` x `fill_width`
/// elements: zeros past the source's extent. Each thread writes 8 destination elements with one
/// 16-byte store (the destination starts on 16 bytes; rows of an odd length do not, so the
/// elements are placed by their flat index). Where its 8 sources are one run of a source row, it
/// reads them as two aligned 16-byte loads and shifts them into place; elsewhere (a row's end,
/// padding, the buffer's last elements) one by one.
const REPITCH: &str = r#"extern "C" __global__ void __launch_bounds__(256) bs_repitch_u16(
    const unsigned short* __restrict__ src, unsigned short* __restrict__ dst, long long matrices, long long rows,
    long long width, long long src_pitch, long long src_matrix, long long fill_rows, long long fill_width) {
  const long long total = matrices * fill_rows * fill_width;
  // Elements of the source up to its last one: 16-byte loads that stay below it are inside it.
  const long long src_end = (matrices - 1) * src_matrix + (rows - 1) * src_pitch + width;
  for (long long chunk = blockIdx.x * (long long)blockDim.x + threadIdx.x; chunk * 8 < total;
       chunk += (long long)gridDim.x * blockDim.x) {
    const long long k = chunk * 8;
    long long r = k / fill_width, c = k - r * fill_width;
    long long mat = r / fill_rows;
    r -= mat * fill_rows;
    const long long s0 = mat * src_matrix + r * src_pitch + c;
    const long long aligned = s0 & ~7ll;
    uint4 out;
    if (k + 8 <= total && r < rows && c + 8 <= width && aligned + 16 <= src_end) {
      const uint4 lo = *reinterpret_cast<const uint4*>(src + aligned);
      const uint4 hi = *reinterpret_cast<const uint4*>(src + aligned + 8);
      const unsigned int w[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
      const unsigned int shift = (unsigned int)(s0 & 1) * 16;
      #define BS_WORDS(q) out = make_uint4(__funnelshift_r(w[q], w[q + 1], shift), \
          __funnelshift_r(w[q + 1], w[q + 2], shift), __funnelshift_r(w[q + 2], w[q + 3], shift), \
          __funnelshift_r(w[q + 3], w[q + 4], shift))
      switch ((int)((s0 - aligned) >> 1)) {
        case 0: BS_WORDS(0); break;
        case 1: BS_WORDS(1); break;
        case 2: BS_WORDS(2); break;
        default: BS_WORDS(3); break;
      }
      #undef BS_WORDS
      *reinterpret_cast<uint4*>(dst + k) = out;
      continue;
    }
    unsigned short v[8];
    #pragma unroll
    for (int i = 0; i < 8; ++i) {
      v[i] = (k + i < total && r < rows && c < width) ? src[mat * src_matrix + r * src_pitch + c] : (unsigned short)0;
      if (++c == fill_width) { c = 0; if (++r == fill_rows) { r = 0; ++mat; } }
    }
    if (k + 8 <= total) {
      *reinterpret_cast<uint4*>(dst + k) = make_uint4(v[0] | ((unsigned int)v[1] << 16), v[2] | ((unsigned int)v[3] << 16),
                                                      v[4] | ((unsigned int)v[5] << 16), v[6] | ((unsigned int)v[7] << 16));
    } else {
      for (int i = 0; k + i < total; ++i) dst[k + i] = v[i];
    }
  }
}
"#;

impl LtGemm {
    /// Plans `shape` on `context` (created on first use): descriptors, layouts and the
    /// heuristic's algorithm.
    pub fn new(
        device: Arc<CudaDevice>,
        context: Arc<Mutex<Option<LtContext>>>,
        shape: GemmShape,
        name: &'static str,
    ) -> Result<Self> {
        // The handle is used under the lock only, here as in `run`.
        let mut lt = context.lock().unwrap_or_else(|p| p.into_inner());
        if lt.is_none() {
            *lt = Some(LtContext::new(&device)?);
        }
        let handle = lt.as_ref().map(|c| c.handle).unwrap_or(std::ptr::null_mut());
        let err = |what: &'static str| move |e| cuda_error(what, e);
        // The dimensions the product runs at (padded, or its own).
        let pad = |d: usize| if padded(&shape) { d.div_ceil(ALIGN_ELEMENTS) * ALIGN_ELEMENTS } else { d };
        let (mp, np, kp) = (pad(shape.m), pad(shape.n), pad(shape.k));
        let (m, n, k) = (mp as u64, np as u64, kp as u64);
        // Column-major, cuBLAS's order: C^T[n, m] = op(B)[n, k] · A^T[k, m], where the
        // row-major buffers read as column-major are A^T (k x m), B^T (n x k) for `matmul`, and
        // W^T (k x n) for `linear`, which op = T turns to n x k; each one's leading dimension is
        // its row-major row length (padded where the product is, below).
        let f32 = match shape.dtype {
            crate::DType::BF16 => sys::cudaDataType_t::CUDA_R_16BF,
            crate::DType::F16 => sys::cudaDataType_t::CUDA_R_16F,
            _ => sys::cudaDataType_t::CUDA_R_32F,
        };
        // Each handle is owned (and destroyed on every early return) from the moment it exists.
        // SAFETY: an all-zero `cublasLtMatmulAlgo_t` is a valid value of the plain C struct; it is
        // overwritten by the heuristic's choice before any product uses it.
        let mut descriptors = Descriptors {
            desc: std::ptr::null_mut(),
            a: std::ptr::null_mut(),
            b: std::ptr::null_mut(),
            c: std::ptr::null_mut(),
            algo: unsafe { std::mem::zeroed() },
        };
        // FP32 accumulation and scaling whatever the operands' dtype.
        descriptors.desc =
            result::create_matmul_desc(sys::cublasComputeType_t::CUBLAS_COMPUTE_32F, sys::cudaDataType_t::CUDA_R_32F)
                .map_err(err("cublasLtMatmulDescCreate"))?;
        // Row-major, our `a` is `[m, k]` (`[k, m]` transposed), `b` `[k, n]` (`[n, k]`), the
        // result `[m, n]`, the bias `[1, n]`: each one's rows and row length, and its staging
        // where padding changes them.
        let of = |batched: bool| if batched { shape.batch } else { 1 };
        let (a_rows, a_width) = if shape.a_transposed { (shape.k, shape.m) } else { (shape.m, shape.k) };
        let (b_rows, b_width) = if shape.b_transposed { (shape.n, shape.k) } else { (shape.k, shape.n) };
        let (ap_rows, ap_width) = if shape.a_transposed { (kp, mp) } else { (mp, kp) };
        let (bp_rows, bp_width) = if shape.b_transposed { (np, kp) } else { (kp, np) };
        let mut next = 0;
        let staged = [
            staged(of(shape.a_batched), (a_rows, a_width), (ap_rows, ap_width), &mut next),
            staged(of(shape.b_batched), (b_rows, b_width), (bp_rows, bp_width), &mut next),
            staged(shape.batch, (shape.m, shape.n), (mp, np), &mut next),
            if shape.bias { staged(1, (1, shape.n), (1, np), &mut next) } else { None },
        ];
        let (a_pitch, b_pitch, c_pitch) = (ap_width as u64, bp_width as u64, np as u64);
        descriptors.a = if shape.b_transposed {
            result::create_matrix_layout(f32, k, n, b_pitch as i64)
        } else {
            result::create_matrix_layout(f32, n, k, b_pitch as i64)
        }
        .map_err(err("cublasLtMatrixLayoutCreate"))?;
        // cuBLASLt's B is our `a` (column-major `[k, m]`, or `[m, k]` read transposed).
        descriptors.b = if shape.a_transposed {
            result::create_matrix_layout(f32, m, k, a_pitch as i64)
        } else {
            result::create_matrix_layout(f32, k, m, a_pitch as i64)
        }
        .map_err(err("cublasLtMatrixLayoutCreate"))?;
        descriptors.c =
            result::create_matrix_layout(f32, n, m, c_pitch as i64).map_err(err("cublasLtMatrixLayoutCreate"))?;
        if shape.batch > 1 {
            // cuBLAS's A is our `b`, its B our `a`. A broadcast operand has a stride of 0.
            let count = i32::try_from(shape.batch).map_err(|_| cuda_error("a batch of more than 2^31 products", ""))?;
            let strides = [
                (descriptors.a, if shape.b_batched { bp_rows as u64 * b_pitch } else { 0 }),
                (descriptors.b, if shape.a_batched { ap_rows as u64 * a_pitch } else { 0 }),
                (descriptors.c, m * c_pitch),
            ];
            for (layout, stride) in strides {
                let stride = stride as i64;
                // SAFETY: each attribute is written from a value of the type cuBLASLt documents
                // for it (`int32_t` count, `int64_t` offset), with its size.
                unsafe {
                    result::set_matrix_layout_attribute(
                        layout,
                        sys::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                        (&count as *const i32).cast(),
                        std::mem::size_of::<i32>(),
                    )
                    .map_err(err("cublasLtMatrixLayoutSetAttribute"))?;
                    result::set_matrix_layout_attribute(
                        layout,
                        sys::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                        (&stride as *const i64).cast(),
                        std::mem::size_of::<i64>(),
                    )
                    .map_err(err("cublasLtMatrixLayoutSetAttribute"))?;
                }
            }
        }
        // `cublasOperation_t` (an `int32_t` attribute): CUBLAS_OP_N = 0, CUBLAS_OP_T = 1.
        let transa: i32 = if shape.b_transposed { 1 } else { 0 };
        let transb: i32 = if shape.a_transposed { 1 } else { 0 };
        let epilogue = match (shape.bias, shape.gelu) {
            (true, true) => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_GELU_BIAS,
            (false, true) => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_GELU,
            (true, false) => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS,
            (false, false) => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_DEFAULT,
        };
        let pref = Preference(result::create_matmul_pref().map_err(err("cublasLtMatmulPreferenceCreate"))?);
        let workspace = WORKSPACE_BYTES;
        let desc = descriptors.desc;
        // SAFETY: each attribute is written from a value of the type cuBLASLt documents for it,
        // with its size; the descriptors were just created; the handle is used under the lock.
        let heuristic = unsafe {
            result::set_matmul_desc_attribute(
                desc,
                sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
                (&transa as *const i32).cast(),
                std::mem::size_of::<i32>(),
            )
            .map_err(err("cublasLtMatmulDescSetAttribute"))?;
            result::set_matmul_desc_attribute(
                desc,
                sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSB,
                (&transb as *const i32).cast(),
                std::mem::size_of::<i32>(),
            )
            .map_err(err("cublasLtMatmulDescSetAttribute"))?;
            result::set_matmul_desc_attribute(
                desc,
                sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_EPILOGUE,
                (&epilogue as *const sys::cublasLtEpilogue_t).cast(),
                std::mem::size_of::<sys::cublasLtEpilogue_t>(),
            )
            .map_err(err("cublasLtMatmulDescSetAttribute"))?;
            result::set_matmul_pref_attribute(
                pref.0,
                sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                (&workspace as *const usize).cast(),
                std::mem::size_of::<usize>(),
            )
            .map_err(err("cublasLtMatmulPreferenceSetAttribute"))?;
            let (a, b, c) = (descriptors.a, descriptors.b, descriptors.c);
            result::get_matmul_algo_heuristic(handle, desc, a, b, c, c, pref.0)
                .map_err(err("cublasLtMatmulAlgoGetHeuristic"))?
        };
        drop(lt);
        descriptors.algo = heuristic.algo;
        let repitch = if staged.iter().any(Option::is_some) {
            Some(device.hand_launched("bs_repitch_u16", REPITCH.into())?)
        } else {
            None
        };
        Ok(Self { device, context, descriptors: Mutex::new(descriptors), shape, name, staged, repitch })
    }
}

/// A matmul preference, destroyed when dropped.
struct Preference(sys::cublasLtMatmulPreference_t);

impl Drop for Preference {
    fn drop(&mut self) {
        // SAFETY: created once by `LtGemm::new` and destroyed once, here.
        unsafe {
            let _ = result::destroy_matmul_pref(self.0);
        }
    }
}

impl DeviceKernel for LtGemm {
    fn run(&self, inputs: &[&dyn DeviceBuffer], outputs: &mut [&mut dyn DeviceBuffer]) -> Result<()> {
        let GemmShape { m, n, k, bias, dtype, batch, a_batched, b_batched, .. } = self.shape;
        let words = |elements: usize| crate::core::plan::packing::words(dtype, elements);
        let needed_inputs = if bias { 3 } else { 2 };
        let fail = |message: String| {
            Err(crate::Error::Execution { executor: "cuda".into(), symbol: self.name.into(), message })
        };
        if inputs.len() != needed_inputs || outputs.len() != 1 {
            return fail(format!(
                "it takes {needed_inputs} input and 1 output buffer(s), not {} and {}",
                inputs.len(),
                outputs.len()
            ));
        }
        let of = |batched: bool| if batched { batch } else { 1 };
        let needs = [words(of(a_batched) * m * k), words(of(b_batched) * n * k), words(n)];
        for (i, (buffer, need)) in inputs.iter().zip(needs).enumerate() {
            if buffer.len() < need {
                return fail(format!("input {i} holds {} device words, but the product reads {need}", buffer.len()));
            }
        }
        if outputs[0].len() < words(batch * m * n) {
            let writes = words(batch * m * n);
            return fail(format!("output 0 holds {} words, but the product writes {writes}", outputs[0].len()));
        }
        let stream = self.device.stream();
        let a = address(inputs[0])?;
        let b = address(inputs[1])?;
        let bias_ptr = if bias { Some(address(inputs[2])?) } else { None };
        let c = address(&*outputs[0])?;
        let mut context = self.context.lock().unwrap_or_else(|p| p.into_inner());
        let context = context.as_mut().ok_or_else(|| cuda_error(self.name, "cuBLASLt was not created"))?;
        let LtContext { handle, workspaces, staging } = context;
        let handle = *handle;
        let workspace = workspaces.get(&stream, WORKSPACE_BYTES)?;
        let (workspace_ptr, _) = workspace.device_ptr(&stream);
        // Padded operands: inputs copied in now, the result copied out after the product.
        let (mut a, mut b, mut c, mut bias_ptr) = (a, b, c, bias_ptr);
        let staging_bytes = self.staged.iter().flatten().map(|s| (s.offset + s.elements()) * 2).max().unwrap_or(0);
        let staging_base =
            if staging_bytes > 0 { staging.get(&stream, staging_bytes)?.device_ptr(&stream).0 } else { 0 };
        let at = |s: &Staged| staging_base + (s.offset * 2) as u64;
        for (i, pointer) in [(0, &mut a), (1, &mut b)] {
            if let Some(s) = &self.staged[i] {
                self.copy_in(&stream, *pointer, at(s), s)?;
                *pointer = at(s);
            }
        }
        if let (Some(s), Some(pointer)) = (&self.staged[3], bias_ptr.as_mut()) {
            self.copy_in(&stream, *pointer, at(s), s)?;
            *pointer = at(s);
        }
        let compact_c = c;
        if let Some(s) = &self.staged[2] {
            c = at(s);
        }
        let descriptors = self.descriptors.lock().unwrap_or_else(|p| p.into_inner());
        let (alpha, beta) = (1.0f32, 0.0f32);
        // SAFETY: the buffers hold what the layouts describe (checked above), the bias pointer
        // is set under the descriptors' mutex just before the product that reads it, and the
        // product and everything it reads and writes are ordered on this run's stream.
        unsafe {
            if let Some(bias_ptr) = bias_ptr {
                result::set_matmul_desc_attribute(
                    descriptors.desc,
                    sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                    (&bias_ptr as *const u64).cast(),
                    std::mem::size_of::<u64>(),
                )
                .map_err(|e| cuda_error("cublasLtMatmulDescSetAttribute", e))?;
            }
            result::matmul(
                handle,
                descriptors.desc,
                (&alpha as *const f32).cast(),
                (&beta as *const f32).cast(),
                b as *const c_void,
                descriptors.a,
                a as *const c_void,
                descriptors.b,
                c as *const c_void,
                descriptors.c,
                c as *mut c_void,
                descriptors.c,
                &descriptors.algo,
                workspace_ptr as *mut c_void,
                WORKSPACE_BYTES,
                stream.cu_stream() as sys::cudaStream_t,
            )
        }
        .map_err(|e| cuda_error("cublasLtMatmul", e))?;
        if let Some(s) = &self.staged[2] {
            let padded = (s.padded_width, s.padded_rows * s.padded_width);
            self.repitch(&stream, (at(s), padded), compact_c, s, (s.rows, s.width))?;
        }
        Ok(())
    }
}

impl LtGemm {
    /// Queues the copy of `staged`'s compact operand at `src` into the scratch at `dst`, zeros
    /// around it.
    fn copy_in(&self, stream: &Arc<cudarc::driver::CudaStream>, src: u64, dst: u64, s: &Staged) -> Result<()> {
        self.repitch(stream, (src, (s.width, s.rows * s.width)), dst, s, (s.padded_rows, s.padded_width))
    }

    /// Queues the copy of `staged`'s matrices from `src` (given with its row pitch and matrix
    /// stride) to the dense `dst` of `fill` (rows, row length) per matrix.
    fn repitch(
        &self,
        stream: &Arc<cudarc::driver::CudaStream>,
        src: (u64, (usize, usize)),
        mut dst: u64,
        staged: &Staged,
        fill: (usize, usize),
    ) -> Result<()> {
        let function = self.repitch.as_ref().ok_or_else(|| cuda_error(self.name, "no padding kernel"))?;
        if !dst.is_multiple_of(16) {
            return Err(cuda_error(self.name, "a padding copy's destination must start on 16 bytes"));
        }
        let (mut src, (src_pitch, src_matrix)) = src;
        let mut longs =
            [staged.matrices, staged.rows, staged.width, src_pitch, src_matrix, fill.0, fill.1].map(|x| x as i64);
        let chunks = (staged.matrices * fill.0 * fill.1).div_ceil(8);
        let config = cudarc::driver::LaunchConfig {
            grid_dim: (chunks.div_ceil(256).clamp(1, 1 << 20) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let [l0, l1, l2, l3, l4, l5, l6] = &mut longs;
        // SAFETY: the parameters are exactly the kernel's (two pointers, seven `long long`s),
        // alive for the call; the source holds its matrices at its pitch and stride (the compact
        // operand by the length checks of `run`, the scratch by its size) and the destination
        // its dense `fill` matrices, from a 16-byte boundary (checked above).
        unsafe {
            let mut params: [*mut c_void; 9] = [
                (&mut src as *mut u64).cast(),
                (&mut dst as *mut u64).cast(),
                (l0 as *mut i64).cast(),
                (l1 as *mut i64).cast(),
                (l2 as *mut i64).cast(),
                (l3 as *mut i64).cast(),
                (l4 as *mut i64).cast(),
                (l5 as *mut i64).cast(),
                (l6 as *mut i64).cast(),
            ];
            super::device_checks::launch(function, stream, config, &mut params)
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_padding_copy_compiles() {
        super::super::compiles_with_nvrtc(super::REPITCH);
    }
}
