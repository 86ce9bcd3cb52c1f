//! The executors layer: the built-in executors. Users' own executors implement
//! [`Executor`](crate::Executor) the same way and sit beside these in a plan's list.

mod cpu_reference;

pub use cpu_reference::CpuReference;
