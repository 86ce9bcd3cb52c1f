//! The executors an example's plan runs on: the CPU's, or with `--cuda` the GPU's.

use std::sync::Arc;

use boundscope::executors::{CpuFusion, CpuReference};
use boundscope::Executor;

/// A fusion executor, and a plan's executors (that one first).
pub type Executors = (Arc<dyn Executor>, Vec<Arc<dyn Executor>>);

/// The fusion executor and the plan's executors: `CpuFusion` and the CPU reference, or with
/// `cuda` `CudaFusion`, `CudaOps` and the CPU reference (for what they do not run).
pub fn executors(cuda: bool) -> boundscope::Result<Executors> {
    if !cuda {
        let fusion = CpuFusion::shared();
        return Ok((fusion.clone(), vec![fusion, CpuReference::shared()]));
    }
    #[cfg(feature = "cuda")]
    {
        use boundscope::executors::cuda::{CudaDevice, CudaFusion, CudaOps};
        let gpu = CudaDevice::new()?;
        let fusion: Arc<dyn Executor> = Arc::new(CudaFusion::new(gpu.clone()));
        Ok((fusion.clone(), vec![fusion, Arc::new(CudaOps::new(gpu)), CpuReference::shared()]))
    }
    #[cfg(not(feature = "cuda"))]
    Err(boundscope::Error::ExecutorUnavailable {
        executor: "cuda".into(),
        reason: "built without the `cuda` feature".into(),
    })
}
