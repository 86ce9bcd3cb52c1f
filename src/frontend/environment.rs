//! Reading the environment: strictly, so that a typo is an error and never silently ignored.

use std::collections::HashMap;
use std::fmt;

use crate::core::options::{Audience, Options};
use crate::error::{Error, Result};

/// Overrides profiler auto-detection: `1` on, `0` off; any other value is an error.
pub const NVTX_OVERRIDE: &str = "BOUNDSCOPE_NVTX";

/// Where the front end reads variables: the process environment, or a fixed set (for tests and
/// for embedders that keep their own configuration).
///
/// ```
/// use boundscope::frontend::Environment;
/// let env = Environment::from_pairs(&[("BOUNDSCOPE_NVTX", "1")]);
/// assert_eq!(env.get("BOUNDSCOPE_NVTX").as_deref(), Some("1"));
/// assert_eq!(env.get("HOME"), None);
/// ```
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

    /// A variable's value, if set (and valid Unicode).
    pub fn get(&self, name: &str) -> Option<String> {
        match &self.fixed {
            Some(map) => map.get(name).cloned(),
            None => std::env::var(name).ok(),
        }
    }

    /// Applies every user option's environment variable to `options`, except options already
    /// set in code.
    ///
    /// # Errors
    /// [`Error::InvalidEnvironment`] naming the variable, its value and what it accepts.
    pub fn apply_to(&self, options: &mut Options) -> Result<()> {
        let set_in_code: Vec<&str> = options.set_names().collect();
        let specs: Vec<_> = options
            .specs()
            .iter()
            .filter(|s| s.audience == Audience::User && !set_in_code.contains(&s.name))
            .filter_map(|s| s.env.map(|var| (s.name, var, s.ty)))
            .collect();
        for (name, variable, ty) in specs {
            if let Some(value) = self.get(variable) {
                options.set_str(name, &value).map_err(|_| Error::InvalidEnvironment {
                    variable: variable.to_string(),
                    value: value.clone(),
                    expected: format!("{ty} (option `{name}`)"),
                })?;
            }
        }
        Ok(())
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
    match env.get("NVTX_INJECTION64_PATH") {
        Some(path) if !path.is_empty() => NvtxTool::InjectionPath(path),
        _ if static_injection_present() => NvtxTool::StaticInjection,
        _ => NvtxTool::None,
    }
}

/// Whether a session profiles, at which level, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProfilingDecision {
    /// `off`, `regions` or `ops`.
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
    ///
    /// # Errors
    /// [`Error::InvalidEnvironment`] if `BOUNDSCOPE_NVTX` is set to anything but `0` or `1`.
    pub fn decide(options: &Options, env: &Environment) -> Result<Self> {
        let level = options.enum_value("runtime.profiling")?;
        if level != "auto" {
            return Ok(Self { level, reason: format!("runtime.profiling={level}") });
        }
        match env.get(NVTX_OVERRIDE).as_deref() {
            Some("1") => return Ok(Self { level: "ops", reason: format!("{NVTX_OVERRIDE}=1") }),
            Some("0") => return Ok(Self { level: "off", reason: format!("{NVTX_OVERRIDE}=0") }),
            Some(other) => {
                return Err(Error::InvalidEnvironment {
                    variable: NVTX_OVERRIDE.into(),
                    value: other.into(),
                    expected: "1 (profile) or 0 (do not profile); unset, a profiler is detected".into(),
                })
            }
            None => {}
        }
        let tool = detect_nvtx_tool(env);
        Ok(Self { level: if tool.is_attached() { "ops" } else { "off" }, reason: format!("detected: {tool}") })
    }
}
