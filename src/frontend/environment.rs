//! Reading the environment: strictly, so that a typo is an error and never silently ignored.

use std::collections::HashMap;
use std::ffi::OsString;
use std::fmt;

use crate::core::options::{Audience, Options};
use crate::error::{did_you_mean, Error, Result};

/// Overrides profiler auto-detection: `1` on, `0` off; any other value is an error.
pub const NVTX_OVERRIDE: &str = crate::core::options::FRONT_END_VARIABLES[0];

/// The directory programs write trace files into (a [`Timeline`](crate::guards::Timeline)'s
/// Chrome trace, say), read by [`Environment::trace_dir`]; the working directory when unset.
pub const TRACE_DIR: &str = crate::core::options::FRONT_END_VARIABLES[1];

/// The prefix of the front end's variables: every variable with it must be one it reads.
const PREFIX: &str = crate::core::options::ENV_PREFIX;

/// Where the front end reads variables: the process environment, or a fixed set (for tests and
/// for embedders that keep their own configuration).
///
/// ```
/// use boundscope::frontend::Environment;
/// let env = Environment::from_pairs(&[("BOUNDSCOPE_NVTX", "1")]);
/// assert_eq!(env.get("BOUNDSCOPE_NVTX").unwrap().as_deref(), Some("1"));
/// assert_eq!(env.get("HOME").unwrap(), None);
/// ```
///
/// The variables the front end reads (any other `BOUNDSCOPE_*` variable is an error, with a
/// suggestion):
///
/// | variable | accepts | effect |
/// | --- | --- | --- |
/// | `BOUNDSCOPE_NVTX` | `1`, `0` | overrides profiler detection (anything else is an error) |
/// | `BOUNDSCOPE_PROFILING` | `auto`, `off`, `scopes`, `regions`, `ops` | `runtime.profiling` |
/// | `BOUNDSCOPE_DEVICE` | `auto`, `cpu`, `cuda` | `runtime.device` |
/// | `BOUNDSCOPE_GPU` | `0` to `1023` | `runtime.gpu`: the GPU's CUDA ordinal (a rank's `LOCAL_RANK`) |
/// | `BOUNDSCOPE_FUSION` | `true`, `false`, `1`, `0` | `runtime.fusion` |
/// | `BOUNDSCOPE_FUSION_STRATEGY` | `consecutive`, `dataflow` | `runtime.fusion_strategy` |
/// | `BOUNDSCOPE_CPU_THREADS` | `0` (every core), `1`, ... | `runtime.cpu_threads`: threads the CPU executors split large ops over |
/// | `BOUNDSCOPE_NVTX_LEVELS` | a list of `trace`, `scope`, `region`, `op`, `subsymbol` | `runtime.nvtx_levels`: only these levels get ranges |
/// | `BOUNDSCOPE_NVTX_EXECUTORS` | a list of executor names: `cpu_reference`, `cpu_fusion`, `cuda_ops`, `cuda_fusion`, `collectives`, `nccl`, a user's own, `runtime` | `runtime.nvtx_executors`: only ranges around what these run (a plan refuses a name that none of its executors and no built-in one has) |
/// | `BOUNDSCOPE_TRACE_DIR` | a directory path | where programs write trace files (`Environment::trace_dir`; the timeline example); unset, the working directory |
/// | `BOUNDSCOPE_NVTX_CATEGORIES` | a list of `elementwise`, `reduction`, `matmul`, `shape`, `composite`, `fusion`, `collective` | `runtime.nvtx_categories`: only ranges around ops of these categories |
#[derive(Clone, Debug, Default)]
pub struct Environment {
    fixed: Option<HashMap<String, String>>,
}

impl Environment {
    /// The process environment.
    pub fn process() -> Self {
        Self { fixed: None }
    }

    /// Exactly these variables.
    pub fn from_pairs(pairs: &[(&str, &str)]) -> Self {
        Self { fixed: Some(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()) }
    }

    /// A variable's value, if set.
    ///
    /// # Errors
    /// [`Error::InvalidEnvironment`] if it is set to something that is not valid Unicode: such
    /// a value is a mistake to report, not a variable to treat as unset.
    pub fn get(&self, name: &str) -> Result<Option<String>> {
        match self.get_os(name) {
            None => Ok(None),
            Some(value) => value.into_string().map(Some).map_err(|value| Error::InvalidEnvironment {
                variable: name.to_string(),
                value: value.to_string_lossy().into_owned(),
                expected: "valid UTF-8 text".into(),
            }),
        }
    }

    /// The directory to write trace files into: [`TRACE_DIR`] if set, else the working
    /// directory (`.`). The value is a path, so any bytes the operating system allows.
    ///
    /// ```
    /// use boundscope::frontend::Environment;
    /// let env = Environment::from_pairs(&[("BOUNDSCOPE_TRACE_DIR", "/tmp/traces")]);
    /// assert_eq!(env.trace_dir().unwrap(), std::path::Path::new("/tmp/traces"));
    /// assert_eq!(Environment::from_pairs(&[]).trace_dir().unwrap(), std::path::Path::new("."));
    /// assert!(Environment::from_pairs(&[("BOUNDSCOPE_TRACE_DIR", "")]).trace_dir().is_err());
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidEnvironment`] if it is set but empty (unset it for the working directory).
    pub fn trace_dir(&self) -> Result<std::path::PathBuf> {
        match self.get_os(TRACE_DIR) {
            None => Ok(std::path::PathBuf::from(".")),
            Some(dir) if dir.is_empty() => Err(Error::InvalidEnvironment {
                variable: TRACE_DIR.into(),
                value: String::new(),
                expected: "a directory path; unset, the working directory".into(),
            }),
            Some(dir) => Ok(dir.into()),
        }
    }

    /// A variable's value as the operating system holds it (for paths), if set.
    fn get_os(&self, name: &str) -> Option<OsString> {
        match &self.fixed {
            Some(map) => map.get(name).map(OsString::from),
            None => std::env::var_os(name),
        }
    }

    /// The names of the variables set that start with [`PREFIX`], sorted (names that are not
    /// Unicode, lossily).
    fn prefixed_names(&self) -> Vec<String> {
        let mut names: Vec<String> = match &self.fixed {
            Some(map) => map.keys().filter(|k| k.starts_with(PREFIX)).cloned().collect(),
            None => std::env::vars_os()
                .map(|(k, _)| k.to_string_lossy().into_owned())
                .filter(|k| k.starts_with(PREFIX))
                .collect(),
        };
        names.sort();
        names
    }

    /// Checks every `BOUNDSCOPE_*` variable, then applies every user option's variable to
    /// `options`, except options already set in code (which win).
    ///
    /// Checked strictly, whether or not a variable takes effect: its name must be one the
    /// front end reads ([`NVTX_OVERRIDE`], [`TRACE_DIR`] or a user option's), its value valid Unicode and
    /// accepted by its option (`BOUNDSCOPE_NVTX`: `0` or `1`; [`TRACE_DIR`]: what
    /// [`trace_dir`](Self::trace_dir) accepts, so not empty).
    ///
    /// ```
    /// use boundscope::frontend::Environment;
    /// use boundscope::options::Options;
    /// use boundscope::Error;
    /// let mut options = Options::new();
    /// Environment::from_pairs(&[("BOUNDSCOPE_FUSION", "0")]).apply_to(&mut options).unwrap();
    /// assert!(!options.bool("runtime.fusion").unwrap());
    /// let typo = Environment::from_pairs(&[("BOUNDSCOPE_FUSOIN", "0")]).apply_to(&mut Options::new());
    /// assert!(matches!(typo, Err(Error::UnknownEnvironmentVariable { .. })));
    /// ```
    ///
    /// # Errors
    /// [`Error::UnknownEnvironmentVariable`] for a `BOUNDSCOPE_*` variable the front end does
    /// not read (with the closest one it does); [`Error::InvalidEnvironment`] naming the
    /// variable, its value and what it accepts.
    pub fn apply_to(&self, options: &mut Options) -> Result<()> {
        let specs: Vec<_> = options
            .specs()
            .iter()
            .filter(|s| s.audience == Audience::User)
            .filter_map(|s| s.env.map(|var| (s.clone(), var)))
            .collect();
        let known: Vec<&str> =
            [NVTX_OVERRIDE, TRACE_DIR].into_iter().chain(specs.iter().map(|(_, var)| *var)).collect();
        for name in self.prefixed_names() {
            if !known.contains(&name.as_str()) {
                // Compared without the prefix they share, so that only a close name is suggested.
                let unprefixed = known.iter().filter_map(|k| k.strip_prefix(PREFIX));
                return Err(Error::UnknownEnvironmentVariable {
                    suggestion: did_you_mean(&name[PREFIX.len()..], unprefixed).map(|s| format!("{PREFIX}{s}")),
                    variable: name,
                    known: known.iter().map(|k| k.to_string()).collect(),
                });
            }
        }
        nvtx_override(self)?;
        // One rule for the trace directory, here and in `trace_dir`.
        self.trace_dir()?;
        let set_in_code: Vec<&str> = options.set_names().collect();
        let mut apply = Vec::new();
        for (spec, variable) in &specs {
            let Some(value) = self.get(variable)? else { continue };
            spec.parse(&value).map_err(|_| Error::InvalidEnvironment {
                variable: variable.to_string(),
                value: value.clone(),
                expected: format!("{} (option `{}`)", spec.ty, spec.name),
            })?;
            if !set_in_code.contains(&spec.name) {
                apply.push((spec.name, value));
            }
        }
        for (name, value) in apply {
            options.set_str(name, &value)?;
        }
        Ok(())
    }
}

/// The value of [`NVTX_OVERRIDE`]: `Some(true)` for `1`, `Some(false)` for `0`, `None` unset.
fn nvtx_override(env: &Environment) -> Result<Option<bool>> {
    match env.get(NVTX_OVERRIDE)?.as_deref() {
        None => Ok(None),
        Some("1") => Ok(Some(true)),
        Some("0") => Ok(Some(false)),
        Some(other) => Err(Error::InvalidEnvironment {
            variable: NVTX_OVERRIDE.into(),
            value: other.into(),
            expected: "1 (profile) or 0 (do not profile); unset, a profiler is detected".into(),
        }),
    }
}

/// How an NVTX tool (a profiler) is attached to this process, if one is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NvtxTool {
    /// `NVTX_INJECTION64_PATH` names an injection library (Nsight Systems and Nsight Compute
    /// set it).
    InjectionPath(String),
    /// The process links a static injection (a strong `InitializeInjectionNvtx2_fnptr`).
    StaticInjection,
    /// None: NVTX calls are no-ops.
    None,
}

impl NvtxTool {
    /// Whether a tool is attached.
    pub fn is_attached(&self) -> bool {
        !matches!(self, NvtxTool::None)
    }
}

impl fmt::Display for NvtxTool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NvtxTool::InjectionPath(p) => write!(f, "NVTX_INJECTION64_PATH={p}"),
            NvtxTool::StaticInjection => f.write_str("a static NVTX injection linked into the process"),
            NvtxTool::None => f.write_str("no NVTX tool attached"),
        }
    }
}

// The NVTX loader declares this weak and null; a static injection defines it strongly.
extern "C" {
    static InitializeInjectionNvtx2_fnptr: Option<unsafe extern "C" fn(*const std::ffi::c_void) -> i32>;
}

fn static_injection_present() -> bool {
    // SAFETY: a plain read of a pointer-sized static that NVTX's loader itself reads; it is
    // written only at link time (a strong definition) and never at run time.
    unsafe { std::ptr::addr_of!(InitializeInjectionNvtx2_fnptr).read_volatile().is_some() }
}

/// Detects an attached NVTX tool.
///
/// ```
/// use boundscope::frontend::{detect_nvtx_tool, Environment, NvtxTool};
/// let env = Environment::from_pairs(&[("NVTX_INJECTION64_PATH", "/opt/nsys/libToolsInjection64.so")]);
/// assert!(matches!(detect_nvtx_tool(&env), NvtxTool::InjectionPath(_)));
/// ```
pub fn detect_nvtx_tool(env: &Environment) -> NvtxTool {
    // A path, not text: any bytes name a library (shown lossily).
    match env.get_os("NVTX_INJECTION64_PATH") {
        Some(path) if !path.is_empty() => NvtxTool::InjectionPath(path.to_string_lossy().into_owned()),
        _ if static_injection_present() => NvtxTool::StaticInjection,
        _ => NvtxTool::None,
    }
}

/// Whether a session profiles, at which level, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProfilingDecision {
    /// `off`, `scopes`, `regions` or `ops`.
    pub level: &'static str,
    /// Why: which option, variable or detection decided it.
    pub reason: String,
}

impl ProfilingDecision {
    /// Whether any range is emitted.
    pub fn is_on(&self) -> bool {
        self.level != "off"
    }

    /// Decides from the `runtime.profiling` option, then [`NVTX_OVERRIDE`], then detection.
    /// `BOUNDSCOPE_NVTX` is checked even when the option decides.
    ///
    /// ```
    /// use boundscope::frontend::{Environment, ProfilingDecision};
    /// use boundscope::options::Options;
    /// let forced = Environment::from_pairs(&[("BOUNDSCOPE_NVTX", "1")]);
    /// assert_eq!(ProfilingDecision::decide(&Options::new(), &forced).unwrap().level, "ops");
    /// let mut off = Options::new();
    /// off.set_str("runtime.profiling", "off").unwrap();
    /// assert_eq!(ProfilingDecision::decide(&off, &forced).unwrap().level, "off");
    /// let typo = Environment::from_pairs(&[("BOUNDSCOPE_NVTX", "on")]);
    /// assert!(ProfilingDecision::decide(&off, &typo).is_err());
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidEnvironment`] if `BOUNDSCOPE_NVTX` is set to anything but `0` or `1`.
    pub fn decide(options: &Options, env: &Environment) -> Result<Self> {
        let nvtx = nvtx_override(env)?;
        let level = options.enum_value("runtime.profiling")?;
        if level != "auto" {
            return Ok(Self { level, reason: format!("runtime.profiling={level}") });
        }
        match nvtx {
            Some(true) => return Ok(Self { level: "ops", reason: format!("{NVTX_OVERRIDE}=1") }),
            Some(false) => return Ok(Self { level: "off", reason: format!("{NVTX_OVERRIDE}=0") }),
            None => {}
        }
        let tool = detect_nvtx_tool(env);
        Ok(Self { level: if tool.is_attached() { "ops" } else { "off" }, reason: format!("detected: {tool}") })
    }
}
