//! Typed options: each declared as a spec (name, type, default, one-line doc, audience), set
//! from code or parsed from strings against its spec, never passed on as a raw string.
//!
//! The runtime declares its options here; every executor declares its own
//! ([`Executor::options`](crate::Executor::options)). Developer options are set only through
//! [`Options::set_developer`], and every plan built with one lists it in its header, so that
//! they cannot slip unnoticed into benchmarks or reference programs. Nothing here reads the
//! environment: the front end ([`crate::frontend`]) does.

mod spec;
mod values;

pub(crate) use spec::{is_list_item, ENV_PREFIX, FRONT_END_VARIABLES};
pub use spec::{Audience, OptionSpec, OptionType, OptionValue, RUNTIME_OPTIONS};
pub use values::Options;
