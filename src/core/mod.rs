//! The core layer: IR, passes, plans and the runtime. Thin and explicit: nothing here reads
//! the environment or switches anything on by itself.

pub mod guards;
pub mod ir;
pub mod options;
pub mod passes;
pub mod plan;
pub mod tensor;
