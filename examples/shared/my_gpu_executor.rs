//! `MyGpu`, a user's GPU executor with kernels of its own: `bias_gelu` (a user's symbol) as an
//! NVRTC-compiled CUDA kernel in `f32` and bf16, and `my_matmul` (another) as a cuBLAS call
//! with a handle and a workspace per plan workspace. It pushes an NVTX range of its own around
//! each op it runs, in its own domain. Shared by `examples/cuda_user_executor.rs` and the GPU
//! tests (`proptests/users_gpu_executors.rs`, `proptests/steady_state_runs_allocate_nothing.rs`).

use std::ffi::c_void;
use std::sync::Arc;

use boundscope::executors::cuda::cudarc::cublas::{sys as cublas_sys, CudaBlas, Gemm, GemmConfig};
use boundscope::executors::cuda::cudarc::driver::{CudaFunction, CudaSlice, DevicePtr, DevicePtrMut, LaunchConfig};
use boundscope::executors::cuda::{cudarc, device_kernel, CudaDevice, CudaKernel, CudaRun, DeviceElement};
use boundscope::{
    kernel_fn, Arena, ArgInfo, Category, DType, Device, DeviceKernel, EmittedRange, Error, Executor, OpView, ParamKind,
    Registry, Result, Symbol, TensorMeta, Trace, TraceBuilder,
};

/// The domain MyGpu pushes its op ranges into.
pub const MY_GPU_DOMAIN: &str = "my_gpu";
static EMITS: [EmittedRange; 1] = [EmittedRange::nvtx_ops(MY_GPU_DOMAIN)];

/// GELU (the tanh approximation) of `x + bias`.
fn bias_gelu(x: f32, bias: f32) -> f32 {
    let v = x + bias;
    0.5 * v * (1.0 + (0.797_884_6 * (v + 0.044_715 * v * v * v)).tanh())
}

/// `bias_gelu(x [..., n], bias [n])`: GELU of `x + bias` (the bias broadcast along the last
/// axis), in `x`'s dtype; the CPU reference computes it in `f32` and rounds once.
pub fn bias_gelu_symbol() -> Symbol {
    Symbol::new("bias_gelu", Category::Elementwise)
        .params(&[ParamKind::Tensor, ParamKind::Tensor])
        .shape_rule(|args| match args {
            [ArgInfo::Tensor { dtype, shape }, ArgInfo::Tensor { dtype: bias_dtype, shape: bias }]
                if shape.last().is_some() && bias == &[*shape.last().unwrap()] && dtype == bias_dtype =>
            {
                Ok(TensorMeta::new(*dtype, shape))
            }
            _ => Err("bias_gelu takes x [..., n] and a bias [n] of x's dtype".into()),
        })
        .cpu_kernel(|_| {
            Ok(kernel_fn(|inputs, outputs| {
                let n = inputs[1].data.len();
                for i in 0..outputs[0].data.len() {
                    let v = bias_gelu(inputs[0].data.f32_at(i), inputs[1].data.f32_at(i % n));
                    outputs[0].data.set_f32(i, v);
                }
                Ok(())
            }))
        })
}

/// `my_matmul(a [m, k], b [k, n])`, in `f32`.
pub fn my_matmul_symbol() -> Symbol {
    Symbol::new("my_matmul", Category::Matmul)
        .params(&[ParamKind::Tensor, ParamKind::Tensor])
        .shape_rule(|args| match args {
            [ArgInfo::Tensor { dtype: DType::F32, shape: [m, k] }, ArgInfo::Tensor { dtype: DType::F32, shape: [k2, n] }]
                if k == k2 =>
            {
                Ok(TensorMeta::new(DType::F32, &[*m, *n]))
            }
            _ => Err("my_matmul takes f32 a [m, k] and b [k, n]".into()),
        })
        .cpu_kernel(|op| {
            let (m, k) = (op.input_shape(0)?[0], op.input_shape(0)?[1]);
            let n = op.input_shape(1)?[1];
            Ok(kernel_fn(move |inputs, outputs| {
                let (a, b) = (inputs[0].values::<f32>()?, inputs[1].values::<f32>()?);
                let c = outputs[0].values_mut::<f32>()?;
                for i in 0..m {
                    for j in 0..n {
                        c[i * n + j] = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
                    }
                }
                Ok(())
            }))
        })
}

/// A registry with the built-ins and MyGpu's two symbols.
pub fn registry() -> Result<Registry> {
    let mut registry = Registry::with_builtins();
    registry.register(bias_gelu_symbol())?;
    registry.register(my_matmul_symbol())?;
    Ok(registry)
}

/// `y = tanh(bias_gelu(my_matmul(x, w), b))` with `x [m, k]`, `w [k, n]`, `b [n]`: two ops for
/// MyGpu, one built-in for the CUDA executors.
pub fn program<'a>(arena: &'a Arena, registry: &'a Registry, m: usize, k: usize, n: usize) -> Result<Trace<'a>> {
    let mut b = TraceBuilder::new(arena, registry);
    let x = b.input(&[m, k])?;
    let w = b.input(&[k, n])?;
    let bias = b.input(&[n])?;
    let h = b.call("my_matmul", &[x.into(), w.into()])?;
    let g = b.call("bias_gelu", &[h.into(), bias.into()])?;
    let y = b.tanh(g)?;
    b.output(y)?;
    b.finish()
}

/// The CUDA source of `bias_gelu`, one kernel per dtype: a thread per element.
const BIAS_GELU_SOURCE: &str = r#"
__device__ float gelu(float v) { return 0.5f * v * (1.0f + tanhf(0.7978846f * (v + 0.044715f * v * v * v))); }
__device__ float bf16_to_float(unsigned short h) { return __uint_as_float(((unsigned int)h) << 16); }
__device__ unsigned short float_to_bf16(float f) {
    unsigned int u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u); // NaN stays NaN
    return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);                // to nearest even
}
extern "C" __global__ void bias_gelu_f32(const float* x, const float* b, float* y, long long len, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < len) y[i] = gelu(x[i] + b[i % n]);
}
extern "C" __global__ void bias_gelu_bf16(const unsigned short* x, const unsigned short* b, unsigned short* y,
                                          long long len, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < len) y[i] = float_to_bf16(gelu(bf16_to_float(x[i]) + bf16_to_float(b[i % n])));
}
"#;

/// Runs `bias_gelu` and `my_matmul` on a GPU with kernels of its own.
pub struct MyGpu {
    device: Arc<CudaDevice>,
    bias_gelu_f32: CudaFunction,
    bias_gelu_bf16: CudaFunction,
}

impl MyGpu {
    /// Compiles its kernels (NVRTC) and loads them on `device`.
    pub fn new(device: Arc<CudaDevice>) -> Result<Self> {
        let failed = |e: &dyn std::fmt::Debug| Error::ExecutorUnavailable {
            executor: "my_gpu".into(),
            reason: format!("cannot compile or load its kernels: {e:?}"),
        };
        let ptx = cudarc::nvrtc::compile_ptx(BIAS_GELU_SOURCE).map_err(|e| failed(&e))?;
        let module = device.context().load_module(ptx).map_err(|e| failed(&e))?;
        let function = |name: &str| module.load_function(name).map_err(|e| failed(&e));
        Ok(Self { bias_gelu_f32: function("bias_gelu_f32")?, bias_gelu_bf16: function("bias_gelu_bf16")?, device })
    }

    /// Its `f32` kernel of `bias_gelu`, for launching by hand (`examples/cuda_user_executor.rs`
    /// compares a plan's launches with those).
    #[allow(dead_code)]
    pub fn bias_gelu_f32(&self) -> CudaFunction {
        self.bias_gelu_f32.clone()
    }
}

impl Executor for MyGpu {
    fn name(&self) -> &str {
        "my_gpu"
    }

    fn claims(&self, op: &OpView<'_>) -> bool {
        match op.name() {
            "bias_gelu" => true,
            "my_matmul" => op.dtypes().as_slice() == [DType::F32],
            _ => false,
        }
    }

    fn dtypes(&self) -> &[DType] {
        &[DType::F32, DType::BF16]
    }

    fn device(&self) -> Option<Arc<dyn Device>> {
        Some(self.device.clone())
    }

    fn compile_device(&self, op: &OpView<'_>) -> Result<Box<dyn DeviceKernel>> {
        let x = op.input_shape(0)?;
        if op.name() == "my_matmul" {
            let b = op.input_shape(1)?;
            let gemm = CublasMatmul { m: x[0], k: x[1], n: b[1] };
            return device_kernel(&self.device, self.name(), op, gemm);
        }
        let function = match op.dtypes().first() {
            Some(DType::BF16) => self.bias_gelu_bf16.clone(),
            _ => self.bias_gelu_f32.clone(),
        };
        let (len, n) = (x.iter().product::<usize>(), *x.last().unwrap_or(&1));
        device_kernel(&self.device, self.name(), op, BiasGelu { function, len, n })
    }

    fn emits(&self) -> &[EmittedRange] {
        &EMITS
    }
}

/// `bias_gelu`: one launch of the NVRTC kernel of its dtype.
struct BiasGelu {
    function: CudaFunction,
    len: usize,
    n: usize,
}

impl BiasGelu {
    /// The device pointers of `x`, `bias` and `y`, read as device memory of `T`.
    fn pointers<T: DeviceElement>(run: &mut CudaRun<'_>) -> Result<[u64; 3]> {
        let stream = run.stream();
        let x = run.input::<T>(0)?.device_ptr(stream).0;
        let bias = run.input::<T>(1)?.device_ptr(stream).0;
        let y = run.output::<T>(0)?.device_ptr_mut(stream).0;
        Ok([x, bias, y])
    }
}

impl CudaKernel for BiasGelu {
    type State = ();

    fn new_state(&self, _run: &CudaRun<'_>) -> Result<()> {
        Ok(())
    }

    fn run(&self, run: &mut CudaRun<'_>, _state: &mut ()) -> Result<()> {
        let [x, bias, y] = match run.input_dtype(0)? {
            DType::BF16 => Self::pointers::<half::bf16>(run)?,
            _ => Self::pointers::<f32>(run)?,
        };
        let mut args = BiasGeluArgs { pointers: [x, bias, y], len: self.len as i64, n: self.n as i64 };
        let config =
            args.config().ok_or_else(|| run.error(format!("{} elements: more than one launch covers", self.len)))?;
        // SAFETY: `bias_gelu_*` takes three pointers and two `long long`s, which `params`
        // points at; it reads `len` elements of `x`, `n` of `bias` and writes `len` of `y`,
        // which the buffers hold (the plan checked their lengths against the op's shapes).
        unsafe { run.launch(&self.function, config, &mut args.params()) }
    }
}

/// The parameters of `bias_gelu_*`: `x`, `bias` and `y`'s device pointers, the element count
/// and the row length.
pub struct BiasGeluArgs {
    pub pointers: [u64; 3],
    pub len: i64,
    pub n: i64,
}

impl BiasGeluArgs {
    /// Pointers to each parameter, for a launch (they point into `self`).
    pub fn params(&mut self) -> [*mut c_void; 5] {
        let [x, bias, y] = &mut self.pointers;
        [
            (x as *mut u64).cast::<c_void>(),
            (bias as *mut u64).cast(),
            (y as *mut u64).cast(),
            (&mut self.len as *mut i64).cast(),
            (&mut self.n as *mut i64).cast(),
        ]
    }

    /// A thread per element, in blocks of 256; `None` past one launch's grid.
    pub fn config(&self) -> Option<LaunchConfig> {
        let blocks = u32::try_from((self.len.max(1) as u64).div_ceil(256)).ok()?;
        Some(LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 })
    }
}

/// `my_matmul`: one cuBLAS `sgemm`, with a handle and a workspace per plan workspace.
struct CublasMatmul {
    m: usize,
    k: usize,
    n: usize,
}

/// cuBLAS's handle for one workspace's stream, and the workspace it uses (set once, so that
/// cuBLAS allocates nothing while a graph is captured).
struct Blas {
    handle: CudaBlas,
    _workspace: CudaSlice<u8>,
}

/// cuBLAS's workspace: what it asks for on Hopper.
const CUBLAS_WORKSPACE: usize = 32 << 20;

impl CudaKernel for CublasMatmul {
    type State = Blas;

    fn new_state(&self, run: &CudaRun<'_>) -> Result<Blas> {
        let handle = CudaBlas::new(run.stream().clone()).map_err(|e| run.error(e))?;
        // SAFETY: cuBLAS only writes its workspace.
        let mut workspace = unsafe { run.stream().alloc::<u8>(CUBLAS_WORKSPACE) }.map_err(|e| run.error(e))?;
        let (ptr, _) = workspace.device_ptr_mut(run.stream());
        // SAFETY: the handle and the buffer are alive, and the buffer outlives the handle's use
        // of it (both live in this state, the handle dropped first).
        unsafe { cublas_sys::cublasSetWorkspace_v2(*handle.handle(), ptr as *mut c_void, CUBLAS_WORKSPACE) }
            .result()
            .map_err(|e| run.error(e))?;
        Ok(Blas { handle, _workspace: workspace })
    }

    fn run(&self, run: &mut CudaRun<'_>, blas: &mut Blas) -> Result<()> {
        let int =
            |d: usize| i32::try_from(d).map_err(|_| run.error(format!("cuBLAS takes dimensions below 2^31, not {d}")));
        let (m, k, n) = (int(self.m)?, int(self.k)?, int(self.n)?);
        let (a, b) = (run.input::<f32>(0)?, run.input::<f32>(1)?);
        let mut c = run.output::<f32>(0)?;
        // Row-major C = A B is column-major C^T = B^T A^T: B first.
        let config = GemmConfig {
            transa: cublas_sys::cublasOperation_t::CUBLAS_OP_N,
            transb: cublas_sys::cublasOperation_t::CUBLAS_OP_N,
            m: n,
            n: m,
            k,
            alpha: 1.0f32,
            lda: n,
            ldb: k,
            beta: 0.0,
            ldc: n,
        };
        // SAFETY: the views hold k x n, m x k and m x n values, the sizes the config names.
        unsafe { blas.handle.gemm(config, &b, &a, &mut c) }.map_err(|e| run.error(e))
    }
}
