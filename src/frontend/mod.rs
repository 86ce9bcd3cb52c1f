//! The front end: the one place that reads the environment, detects an attached profiler, and
//! applies defaults, for people who never look at traces. The core stays thin and explicit.
//!
//! [`ProfiledSession`] takes a trace to results in one call: options from the environment,
//! the standard passes, fusion, and NVTX ranges switched on by themselves when Nsight Systems
//! or Nsight Compute is attached.

mod environment;
mod plan_cache;
mod session;

pub use environment::{detect_nvtx_tool, Environment, NvtxTool, ProfilingDecision, NVTX_OVERRIDE, TRACE_DIR};
pub use plan_cache::CACHED_PLANS;
pub use session::ProfiledSession;

use crate::core::options::{OptionSpec, Options, RUNTIME_OPTIONS};
use crate::executors::cuda::CUDA_OPTIONS;
use crate::executors::CPU_FUSION_OPTIONS;

/// The specs of the runtime and the built-in executors (the CUDA executors' also where the
/// crate is built without them, so that options are the same everywhere).
pub(crate) fn builtin_specs() -> Vec<OptionSpec> {
    RUNTIME_OPTIONS.iter().chain(CPU_FUSION_OPTIONS).chain(CUDA_OPTIONS).cloned().collect()
}

impl Options {
    /// Every built-in spec (the runtime's and the built-in executors'), no values set.
    pub fn new() -> Self {
        Self::with_specs(&builtin_specs())
    }
}

impl Default for Options {
    fn default() -> Self {
        Self::new()
    }
}

/// Every built-in option: name, type, default, one-line doc, audience and environment
/// variable. `cargo run --example options` prints them as a table.
///
/// ```
/// use boundscope::options::{list, Audience};
/// let specs = list();
/// assert!(specs.iter().any(|s| s.name == "runtime.fusion" && s.audience == Audience::User));
/// assert!(specs.iter().any(|s| s.name == "cpu_fusion.block_size" && s.audience == Audience::Developer));
/// ```
pub fn list() -> Vec<OptionSpec> {
    builtin_specs()
}

#[cfg(test)]
mod tests;
