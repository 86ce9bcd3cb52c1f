//! CUDA executors: [`CudaFusion`] (one generated kernel per fused region, with its own NVTX
//! range per region) and [`CudaOps`] (a generated kernel per elementwise prim, last-axis
//! reduction, cast or shape op, cuBLASLt for `matmul` and `linear`, a row kernel each for
//! `softmax` and `layer_norm`) on a [`CudaDevice`], in `f32`, bf16 and f16; run-time
//! availability; the CUDA C generator.
//!
//! The crate builds everywhere: `cudarc` loads the driver dynamically, and everything here
//! checks for the driver library and a device before touching the API (cudarc's loader panics
//! when the library is missing). With no driver or no device, CUDA is reported unavailable and
//! the CPU executors run everything.
//!
//! ```no_run
//! # #[cfg(feature = "cuda")] {
//! use std::sync::Arc;
//! use boundscope::executors::cuda::{CudaDevice, CudaFusion, CudaOps};
//! use boundscope::executors::CpuReference;
//! use boundscope::Executor;
//! let gpu = CudaDevice::new()?; // Err(ExecutorUnavailable) without a driver or a device
//! let fusion: Arc<dyn Executor> = Arc::new(CudaFusion::new(gpu.clone()));
//! let executors = [fusion, Arc::new(CudaOps::new(gpu)), CpuReference::shared()];
//! // FuseRegions::new(executors[0].clone()) makes `CudaFusion<N>` regions; Plan::compile(&trace,
//! // &executors) runs them on the GPU, inserting uploads and downloads where needed.
//! # }
//! # Ok::<(), boundscope::Error>(())
//! ```
//!
//! [`CudaEventTimer`] is a guard that measures device time per op or region with pooled CUDA
//! events.

mod codegen;
#[cfg(feature = "cuda")]
mod device;
#[cfg(feature = "cuda")]
mod event_timer;
#[cfg(feature = "cuda")]
mod executors;
#[cfg(feature = "cuda")]
mod gemm;
mod row_kernels;

pub use codegen::{op_source, region_source, shape_op_source, RegionSource};
#[cfg(feature = "cuda")]
pub use device::{CudaBuffer, CudaDevice};
#[cfg(feature = "cuda")]
pub use event_timer::CudaEventTimer;
#[cfg(feature = "cuda")]
pub use executors::{CudaFusion, CudaOps};

use crate::core::plan::Availability;

/// Whether CUDA can run here: the driver library is present and device 0 can be opened.
///
/// ```
/// use boundscope::executors::cuda;
/// use boundscope::Availability;
/// match cuda::availability() {
///     Availability::Available => println!("CUDA device found"),
///     Availability::Unavailable(why) => println!("CPU only: {why}"),
/// }
/// ```
pub fn availability() -> Availability {
    #[cfg(feature = "cuda")]
    {
        // SAFETY: only checks whether the driver library can be loaded; no CUDA call is made.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Availability::Unavailable("no CUDA driver library (libcuda.so) was found".into());
        }
        match cudarc::driver::CudaContext::new(0) {
            Ok(_) => Availability::Available,
            Err(e) => {
                Availability::Unavailable(format!("the CUDA driver is present but device 0 cannot be used ({e})"))
            }
        }
    }
    #[cfg(not(feature = "cuda"))]
    {
        Availability::Unavailable("boundscope was built without its `cuda` feature".into())
    }
}

/// `Ok` if CUDA is available, else [`Error::ExecutorUnavailable`](crate::Error) saying why:
/// for programs that require a GPU instead of falling back to the CPU.
///
/// # Errors
/// [`Error::ExecutorUnavailable`](crate::Error::ExecutorUnavailable).
pub fn require() -> crate::Result<()> {
    match availability() {
        Availability::Available => Ok(()),
        Availability::Unavailable(reason) => Err(crate::Error::ExecutorUnavailable { executor: "cuda".into(), reason }),
    }
}
