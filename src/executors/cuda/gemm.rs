//! Matrix products through cuBLASLt, planned when the plan is compiled: `matmul`, and `linear`
//! as one product that reads the weight transposed (an operation flag, not a copy) and adds the
//! bias in its epilogue, where the decomposition takes a transpose, a product and an add;
//! `linear_gelu` applies GELU in the same epilogue.
//!
//! Descriptors, layouts and the algorithm (cuBLASLt's heuristic, with a 32 MiB workspace) are
//! made once per bound symbol; a run sets the bias pointer and calls `cublasLtMatmul` on the
//! stream of its workspace, with a workspace buffer of that stream's own, so that runs on
//! several streams never share one. Compute is FP32 (`CUBLAS_COMPUTE_32F`: no TF32).

use std::ffi::c_void;
use std::sync::{Arc, Mutex};

use cudarc::cublaslt::{result, sys};
use cudarc::driver::{DevicePtr, DevicePtrMut};

use super::device::{cuda_error, slice, slice_mut, CudaDevice};
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
        Ok(Self { handle, workspaces: StreamWorkspaces::default() })
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
}

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
        let (m, n, k) = (shape.m as u64, shape.n as u64, shape.k as u64);
        // Column-major, cuBLAS's order: C^T[n, m] = op(B)[n, k] · A^T[k, m], where the
        // row-major buffers read as column-major are A^T (k x m, leading k), B^T (n x k, leading
        // n) for `matmul`, and W^T (k x n, leading k) for `linear`, which op = T turns to n x k.
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
        descriptors.a = if shape.b_transposed {
            result::create_matrix_layout(f32, k, n, k as i64)
        } else {
            result::create_matrix_layout(f32, n, k, n as i64)
        }
        .map_err(err("cublasLtMatrixLayoutCreate"))?;
        // cuBLASLt's B is our `a` (column-major `[k, m]`, or `[m, k]` read transposed).
        descriptors.b = if shape.a_transposed {
            result::create_matrix_layout(f32, m, k, m as i64)
        } else {
            result::create_matrix_layout(f32, k, m, k as i64)
        }
        .map_err(err("cublasLtMatrixLayoutCreate"))?;
        descriptors.c = result::create_matrix_layout(f32, n, m, n as i64).map_err(err("cublasLtMatrixLayoutCreate"))?;
        if shape.batch > 1 {
            // cuBLAS's A is our `b`, its B our `a`. A broadcast operand has a stride of 0.
            let count = i32::try_from(shape.batch).map_err(|_| cuda_error("a batch of more than 2^31 products", ""))?;
            let strides = [
                (descriptors.a, if shape.b_batched { n * k } else { 0 }),
                (descriptors.b, if shape.a_batched { m * k } else { 0 }),
                (descriptors.c, m * n),
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
        Ok(Self { device, context, descriptors: Mutex::new(descriptors), shape, name })
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
        let (a, _) = slice(inputs[0])?.device_ptr(&stream);
        let (b, _) = slice(inputs[1])?.device_ptr(&stream);
        let bias_ptr = if bias { Some(slice(inputs[2])?.device_ptr(&stream).0) } else { None };
        let (c, _) = slice_mut(&mut *outputs[0])?.device_ptr_mut(&stream);
        let mut context = self.context.lock().unwrap_or_else(|p| p.into_inner());
        let context = context.as_mut().ok_or_else(|| cuda_error(self.name, "cuBLASLt was not created"))?;
        let handle = context.handle;
        let workspace = context.workspaces.get(&stream, WORKSPACE_BYTES)?;
        let (workspace_ptr, _) = workspace.device_ptr(&stream);
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
        .map_err(|e| cuda_error("cublasLtMatmul", e))
    }
}
