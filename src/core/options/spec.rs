//! Option specs: what an option is, what it accepts, and who it is for.

use std::fmt;

use crate::error::{Error, Result};

/// Who an option is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Audience {
    /// Users: safe to set anywhere; the default is right unless the doc says when to deviate.
    User,
    /// Developers of an executor: experiments and debugging only, set through
    /// [`Options::set_developer`](crate::options::Options::set_developer).
    Developer,
}

impl fmt::Display for Audience {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Audience::User => "user",
            Audience::Developer => "developer",
        })
    }
}

/// The type of an option's values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OptionType {
    /// `true` or `false` (strings: `true`, `false`, `1`, `0`).
    Bool,
    /// An integer in `min..=max`.
    Int {
        /// Smallest accepted value.
        min: i64,
        /// Largest accepted value.
        max: i64,
    },
    /// One of these names.
    Enum(&'static [&'static str]),
    /// A comma-separated list of these names (each at most once, no empty item; the empty
    /// string is the empty list).
    EnumList(&'static [&'static str]),
    /// A comma-separated list of names that no list can enumerate, as executors' (users define
    /// their own): each not empty, without surrounding spaces or control characters, at most
    /// once; the empty string is the empty list. Whoever reads it checks the names against
    /// what exists.
    NameList,
}

impl fmt::Display for OptionType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OptionType::Bool => f.write_str("bool"),
            OptionType::Int { min, max } => write!(f, "integer {min}..={max}"),
            OptionType::Enum(names) => write!(f, "one of {}", names.join("|")),
            OptionType::EnumList(names) => write!(f, "comma-separated list of {} (or empty)", names.join(",")),
            OptionType::NameList => f.write_str("comma-separated list of names (or empty)"),
        }
    }
}

/// A value of an option.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OptionValue {
    /// A `Bool` option's value.
    Bool(bool),
    /// An `Int` option's value.
    Int(i64),
    /// An `Enum` option's value.
    Enum(&'static str),
    /// An `EnumList` option's value.
    EnumList(Vec<&'static str>),
    /// A `NameList` option's value.
    NameList(Vec<String>),
}

impl fmt::Display for OptionValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OptionValue::Bool(b) => write!(f, "{b}"),
            OptionValue::Int(i) => write!(f, "{i}"),
            OptionValue::Enum(e) => f.write_str(e),
            OptionValue::EnumList(l) => f.write_str(&l.join(",")),
            OptionValue::NameList(l) => f.write_str(&l.join(",")),
        }
    }
}

impl From<bool> for OptionValue {
    fn from(b: bool) -> Self {
        OptionValue::Bool(b)
    }
}

impl From<i64> for OptionValue {
    fn from(i: i64) -> Self {
        OptionValue::Int(i)
    }
}

/// One declared option.
///
/// ```
/// use boundscope::options::{Audience, OptionSpec, OptionType, OptionValue};
/// const BLOCK: OptionSpec = OptionSpec {
///     name: "my_executor.block",
///     ty: OptionType::Int { min: 1, max: 1 << 20 },
///     default: OptionValue::Int(4096),
///     doc: "Elements per block; raise it only if profiles show per-block overhead.",
///     audience: Audience::Developer,
///     env: None,
/// };
/// assert_eq!(BLOCK.parse("8192").unwrap(), OptionValue::Int(8192));
/// assert!(BLOCK.parse("0").is_err());
/// assert!(BLOCK.parse("lots").is_err());
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OptionSpec {
    /// `owner.name`: the owner is `runtime`, an executor's name, or a family of executors'
    /// (`cuda`).
    pub name: &'static str,
    /// What it accepts.
    pub ty: OptionType,
    /// Its value when not set.
    pub default: OptionValue,
    /// One line: what it does and when to deviate from the default.
    pub doc: &'static str,
    /// Who it is for.
    pub audience: Audience,
    /// The environment variable the front end reads it from, if any (user options only).
    pub env: Option<&'static str>,
}

impl OptionSpec {
    /// The owner: the part of the name before the first `.` (`runtime`, `cpu_fusion`, ...).
    pub fn owner(&self) -> &'static str {
        self.name.split('.').next().unwrap_or(self.name)
    }

    /// Parses a string against this spec.
    ///
    /// # Errors
    /// [`Error::InvalidOptionValue`] naming what was expected.
    pub fn parse(&self, text: &str) -> Result<OptionValue> {
        let invalid = || Error::InvalidOptionValue {
            name: self.name.to_string(),
            expected: self.ty.to_string(),
            got: text.escape_default().to_string(),
        };
        match self.ty {
            OptionType::Bool => match text {
                "true" | "1" => Ok(OptionValue::Bool(true)),
                "false" | "0" => Ok(OptionValue::Bool(false)),
                _ => Err(invalid()),
            },
            OptionType::Int { .. } => {
                text.parse::<i64>().map_err(|_| invalid()).and_then(|i| self.check(&OptionValue::Int(i)))
            }
            OptionType::Enum(names) => {
                names.iter().find(|n| **n == text).map(|n| OptionValue::Enum(n)).ok_or_else(invalid)
            }
            OptionType::EnumList(names) => {
                let mut items = Vec::new();
                // Empty: the empty list. Otherwise every item names one (`trace,,op` and
                // `trace,` are typos, not lists of two and one).
                for item in text.split(',').filter(|_| !text.is_empty()) {
                    let name = names.iter().find(|n| **n == item).ok_or_else(invalid)?;
                    if items.contains(name) {
                        return Err(invalid());
                    }
                    items.push(*name);
                }
                Ok(OptionValue::EnumList(items))
            }
            OptionType::NameList => {
                let items: Vec<String> = text.split(',').filter(|_| !text.is_empty()).map(str::to_string).collect();
                self.check(&OptionValue::NameList(items)).map_err(|_| invalid())
            }
        }
    }

    /// Checks a value against this spec (type and range), returning it.
    ///
    /// # Errors
    /// [`Error::InvalidOptionValue`] naming what was expected.
    pub fn check(&self, value: &OptionValue) -> Result<OptionValue> {
        let ok = match (&self.ty, value) {
            (OptionType::Bool, OptionValue::Bool(_)) => true,
            (OptionType::Int { min, max }, OptionValue::Int(i)) => (*min..=*max).contains(i),
            (OptionType::Enum(names), OptionValue::Enum(e)) => names.contains(e),
            (OptionType::EnumList(names), OptionValue::EnumList(l)) => {
                l.iter().all(|e| names.contains(e)) && l.iter().enumerate().all(|(i, e)| !l[..i].contains(e))
            }
            (OptionType::NameList, OptionValue::NameList(l)) => {
                l.iter().all(|e| is_list_item(e)) && l.iter().enumerate().all(|(i, e)| !l[..i].contains(e))
            }
            _ => false,
        };
        if ok {
            Ok(value.clone())
        } else {
            Err(Error::InvalidOptionValue {
                name: self.name.to_string(),
                expected: self.ty.to_string(),
                got: value.to_string(),
            })
        }
    }

    /// Checks the spec itself, as [`Options::declare`](super::Options::declare) does: a name
    /// `owner.name` (letters, digits, `_` and `-`, components joined by `.`), a type whose names
    /// parse back (not empty, no `,` or surrounding spaces; `min <= max`), a default of that type,
    /// and an environment variable only for a user option, named `BOUNDSCOPE_...` (the front
    /// end reads those) but not one the front end reads for itself (`BOUNDSCOPE_NVTX`,
    /// `BOUNDSCOPE_TRACE_DIR`).
    ///
    /// # Errors
    /// [`Error::InvalidOptionValue`] naming what is wrong; [`Error::ConflictingOption`] for an
    /// environment variable on a developer option.
    pub fn validate(&self) -> Result<()> {
        let invalid = |expected: &str, got: &str| {
            Err(Error::InvalidOptionValue { name: self.name.to_string(), expected: expected.into(), got: got.into() })
        };
        if !self.name.contains('.') || !self.name.split('.').all(is_name) {
            return invalid(
                "an option name `owner.name` (letters, digits, `_` and `-`, components joined by `.`)",
                self.name,
            );
        }
        let names = match self.ty {
            OptionType::Enum(names) | OptionType::EnumList(names) => names,
            OptionType::Int { min, max } if min > max => {
                return invalid("an integer type whose `min` is at most its `max`", &format!("{min}..={max}"))
            }
            _ => &[],
        };
        if let Some(bad) = names.iter().find(|n| n.is_empty() || n.contains(',') || n.trim() != **n) {
            return invalid("names of values that are not empty and hold no `,` or surrounding spaces", bad);
        }
        self.check(&self.default)?;
        match self.env {
            Some(env) if self.audience == Audience::Developer => Err(Error::ConflictingOption {
                name: self.name.to_string(),
                detail: format!(
                    "a developer option read from an environment variable (`{env}`); environment variables set user \
                     options only: drop `env`, or make the option `Audience::User`"
                ),
            }),
            Some(env)
                if !env.starts_with(ENV_PREFIX)
                    || env.len() == ENV_PREFIX.len()
                    || !env.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_') =>
            {
                invalid("an environment variable `BOUNDSCOPE_...` (capitals, digits and `_`)", env)
            }
            Some(env) if FRONT_END_VARIABLES.contains(&env) => Err(Error::ConflictingOption {
                name: self.name.to_string(),
                detail: format!("`{env}` is a variable the front end reads for itself; give the option another"),
            }),
            _ => Ok(()),
        }
    }
}

/// Whether `text` is a component of an option's name: not empty, of letters, digits, `_` and
/// `-`.
fn is_name(text: &str) -> bool {
    !text.is_empty() && text.chars().all(|ch| ch.is_ascii_alphanumeric() || ch == '_' || ch == '-')
}

/// Whether `text` is an item of a `NameList`: not empty, no `,`, no surrounding spaces, no
/// control characters. Executors' names keep the same rule (`Plan::compile`), so that each
/// can be an item.
pub(crate) fn is_list_item(text: &str) -> bool {
    !text.is_empty() && !text.contains(',') && text.trim() == text && !text.chars().any(char::is_control)
}

/// The prefix of the environment variables the front end reads options from.
pub(crate) const ENV_PREFIX: &str = "BOUNDSCOPE_";

/// The variables the front end reads for itself, not for an option (`frontend::NVTX_OVERRIDE`
/// and `frontend::TRACE_DIR`).
pub(crate) const FRONT_END_VARIABLES: &[&str] = &["BOUNDSCOPE_NVTX", "BOUNDSCOPE_TRACE_DIR"];

/// Profiling levels (`runtime.profiling`).
pub(crate) const PROFILING_LEVELS: &[&str] = &["auto", "off", "scopes", "regions", "ops"];
/// Devices (`runtime.device`).
pub(crate) const DEVICES: &[&str] = &["auto", "cpu", "cuda"];
/// Fusion strategies (`runtime.fusion_strategy`).
pub(crate) const FUSION_STRATEGIES: &[&str] = &["consecutive", "dataflow"];

/// Range levels (`runtime.nvtx_levels`).
pub(crate) const NVTX_LEVELS: &[&str] = crate::core::plan::range_filter::LEVEL_NAMES;
/// Symbol categories whose ranges are kept (`runtime.nvtx_categories`).
pub(crate) const NVTX_CATEGORIES: &[&str] = crate::core::plan::range_filter::CATEGORY_NAMES;

/// The runtime's own options (those of the front end's pipeline).
pub const RUNTIME_OPTIONS: &[OptionSpec] = &[
    OptionSpec {
        name: "runtime.profiling",
        ty: OptionType::Enum(PROFILING_LEVELS),
        default: OptionValue::Enum("auto"),
        doc: "NVTX ranges: auto (on when a profiler is attached), off, scopes (one per named scope and run), regions (scopes and fused regions), ops (scopes and every op).",
        audience: Audience::User,
        env: Some("BOUNDSCOPE_PROFILING"),
    },
    OptionSpec {
        name: "runtime.device",
        ty: OptionType::Enum(DEVICES),
        default: OptionValue::Enum("auto"),
        doc: "auto: the GPU when CUDA can run here, else the CPU (said once on stderr); cpu; cuda: required, an error without a GPU.",
        audience: Audience::User,
        env: Some("BOUNDSCOPE_DEVICE"),
    },
    OptionSpec {
        name: "runtime.gpu",
        ty: OptionType::Int { min: 0, max: 1023 },
        default: OptionValue::Int(0),
        doc: "Which GPU plans run on (its CUDA ordinal): with one process per GPU, each sets its LOCAL_RANK here. On a machine with GPUs, one other than 0 that is not there is an error, also with runtime.device=auto.",
        audience: Audience::User,
        env: Some("BOUNDSCOPE_GPU"),
    },
    OptionSpec {
        name: "runtime.fusion",
        ty: OptionType::Bool,
        default: OptionValue::Bool(true),
        doc: "Fuse elementwise chains; turn off only to compare against unfused execution.",
        audience: Audience::User,
        env: Some("BOUNDSCOPE_FUSION"),
    },
    OptionSpec {
        name: "runtime.cpu_threads",
        ty: OptionType::Int { min: 0, max: 4096 },
        default: OptionValue::Int(0),
        doc: "Threads the CPU executors split large ops and regions over: 0 = every core; 1 = the calling thread only (for a process that runs many plans side by side).",
        audience: Audience::User,
        env: Some("BOUNDSCOPE_CPU_THREADS"),
    },
    OptionSpec {
        name: "runtime.fusion_strategy",
        ty: OptionType::Enum(FUSION_STRATEGIES),
        default: OptionValue::Enum("consecutive"),
        doc: "consecutive: runs of adjacent ops; dataflow: also across independent ops (fewer, larger regions).",
        audience: Audience::User,
        env: Some("BOUNDSCOPE_FUSION_STRATEGY"),
    },
    OptionSpec {
        name: "runtime.nvtx_levels",
        ty: OptionType::EnumList(NVTX_LEVELS),
        default: OptionValue::EnumList(Vec::new()),
        doc: "Levels that get NVTX ranges, e.g. trace,region; empty: all. Ranges left out are never prepared (no cost per op).",
        audience: Audience::User,
        env: Some("BOUNDSCOPE_NVTX_LEVELS"),
    },
    OptionSpec {
        name: "runtime.nvtx_executors",
        ty: OptionType::NameList,
        default: OptionValue::NameList(Vec::new()),
        doc: "Only ranges around what these executors run (Executor::name; runtime: spans several share); a plan refuses a name none of its executors and no built-in one has; empty: all. Run ranges always stay.",
        audience: Audience::User,
        env: Some("BOUNDSCOPE_NVTX_EXECUTORS"),
    },
    OptionSpec {
        name: "runtime.nvtx_categories",
        ty: OptionType::EnumList(NVTX_CATEGORIES),
        default: OptionValue::EnumList(Vec::new()),
        doc: "Only ranges around ops of these categories (a region: one of its ops); empty: all. Run ranges always stay.",
        audience: Audience::User,
        env: Some("BOUNDSCOPE_NVTX_CATEGORIES"),
    },
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_with_an_empty_item_is_refused_and_the_empty_string_is_the_empty_list() {
        let spec = RUNTIME_OPTIONS.iter().find(|s| s.name == "runtime.nvtx_levels").unwrap();
        assert_eq!(spec.parse("").unwrap(), OptionValue::EnumList(Vec::new()));
        assert_eq!(spec.parse("trace,op").unwrap(), OptionValue::EnumList(vec!["trace", "op"]));
        for typo in ["trace,,op", "trace,", ",op", ",", "trace, op", "trace,trace"] {
            let err = spec.parse(typo).unwrap_err().to_string();
            assert!(err.contains("runtime.nvtx_levels") && err.contains("comma-separated list of"), "{typo}: {err}");
        }
    }

    /// Every built-in spec (the runtime's, the CPU fusion's, the CUDA executors') passes
    /// `validate`; specs that would misbehave later are refused when declared: a name without an
    /// owner or with spaces, names of values that would not parse back, an environment variable
    /// on a developer option (the front end refused to read it), one named outside
    /// `BOUNDSCOPE_`, or one another option reads (one variable set both).
    #[test]
    fn specs_are_validated_when_declared() {
        use crate::options::Options;
        for spec in Options::new().specs() {
            spec.validate().unwrap_or_else(|e| panic!("{}: {e}", spec.name));
        }
        let good = OptionSpec {
            name: "mine.knob",
            ty: OptionType::Bool,
            default: OptionValue::Bool(false),
            doc: "A knob.",
            audience: Audience::User,
            env: Some("BOUNDSCOPE_MINE_KNOB"),
        };
        let mut options = Options::runtime_only();
        options.declare(std::slice::from_ref(&good)).unwrap();
        let bad = [
            (OptionSpec { name: "", ..good.clone() }, "owner.name"),
            (OptionSpec { name: "noowner", ..good.clone() }, "owner.name"),
            (OptionSpec { name: "mine.knob ", ..good.clone() }, "owner.name"),
            (OptionSpec { name: "mine..knob", ..good.clone() }, "owner.name"),
            (
                OptionSpec {
                    name: "mine.list",
                    ty: OptionType::EnumList(&["a", "", "b,c"]),
                    default: OptionValue::EnumList(vec!["b,c"]),
                    env: None,
                    ..good.clone()
                },
                "hold no `,`",
            ),
            (
                OptionSpec { name: "mine.int", ty: OptionType::Int { min: 2, max: 1 }, env: None, ..good.clone() },
                "at most its `max`",
            ),
            (OptionSpec { name: "mine.dev", audience: Audience::Developer, ..good.clone() }, "user options only"),
            (OptionSpec { name: "mine.env", env: Some("MY_KNOB"), ..good.clone() }, "BOUNDSCOPE_"),
            (OptionSpec { name: "mine.fusion", env: Some("BOUNDSCOPE_FUSION"), ..good.clone() }, "runtime.fusion"),
            (OptionSpec { name: "mine.nvtx", env: Some("BOUNDSCOPE_NVTX"), ..good.clone() }, "for itself"),
            (OptionSpec { name: "mine.other", ..good.clone() }, "mine.knob"),
        ];
        for (spec, says) in bad {
            let err = options.declare(std::slice::from_ref(&spec)).unwrap_err();
            assert!(err.to_string().contains(says), "{}: {err}", spec.name);
            assert!(options.spec(spec.name).is_err(), "{}: declared anyway", spec.name);
        }
        // A getter of another type says which one reads the option.
        let err = options.int("runtime.fusion").unwrap_err().to_string();
        assert!(err.contains("a bool, read with `Options::bool`"), "{err}");
    }
}
