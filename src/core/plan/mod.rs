//! Plans: a trace compiled against an ordered executor list, and the runtime that runs it many
//! times with reusable workspaces.

mod buffer_reuse;
mod compile;
mod device;
mod device_tensor;
mod executor;
mod graph;
mod guard_schedule;
mod in_place;
mod one_per_scope;
pub(crate) mod packing;
pub(crate) mod range_filter;
mod range_map;
mod scope_details;
mod workspace;

pub use compile::Plan;
pub use device::{Device, DeviceBuffer, DeviceGraph, DeviceKernel, DeviceQueue};
pub use device_tensor::{DeviceTensor, PlanInput, RunInput, RunInputMut};
pub use executor::{
    kernel_fn, Availability, EmittedRange, Executor, Fusible, Kernel, MapKernel, OpView, PreparedRegionRange,
    RegionRange,
};
pub use graph::PlanGraph;
pub use range_filter::RangeFilter;
pub use range_map::{PlannedRange, PushedBy, RangeMap};
pub use workspace::{DeviceOutputs, Outputs, Workspace};

#[cfg(test)]
mod tests;
