//! The executors layer: the built-in executors. Users' own executors implement
//! [`Executor`](crate::Executor) the same way and sit beside these in a plan's list.

mod cpu_fusion;
pub(crate) mod cpu_reference;
pub mod cuda;
pub(crate) mod worker_pool;

pub use cpu_fusion::{
    scratch_bytes as cpu_fusion_scratch_bytes, CpuFusion, FusedRegion, CPU_FUSION_OPTIONS, DEFAULT_BLOCK,
};
pub use cpu_reference::{math, CpuReference};
