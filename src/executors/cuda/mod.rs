//! CUDA support: run-time availability, and code generation for fused regions.
//!
//! The crate builds everywhere: `cudarc` loads the driver dynamically, and everything here
//! checks for the driver library and a device before touching the API (cudarc's loader panics
//! when the library is missing). With no driver or no device, CUDA is reported unavailable and
//! the CPU executors run everything.
//!
//! Status: the generated CUDA C of a fused region is complete and verified on an H200 by
//! `examples/cuda_bench.rs` (results against the CPU reference, bandwidth against a
//! device-to-device copy, NVTX nesting under `ncu --nvtx`). Plan-integrated CUDA executors
//! (device buffers in workspaces, per-op kernels, cuBLAS matmul, event guards) are the next
//! step and are not in this release.

mod codegen;
#[cfg(feature = "cuda")]
mod device;
#[cfg(feature = "cuda")]
mod executors;

pub use codegen::{op_source, region_source, RegionSource};
#[cfg(feature = "cuda")]
pub use device::{CudaBuffer, CudaDevice};
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
