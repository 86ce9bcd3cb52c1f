//! A set of option values, checked against their specs.

use std::fmt;

use super::spec::{Audience, OptionSpec, OptionValue, RUNTIME_OPTIONS};
use crate::error::{did_you_mean, Error, Result};

/// Option values for a session or a plan: every value checked against its spec when set.
///
/// ```
/// use boundscope::options::{OptionValue, Options};
/// use boundscope::Error;
/// let mut options = Options::new();
/// options.set_str("runtime.fusion_strategy", "dataflow").unwrap();
/// assert_eq!(options.get("runtime.fusion_strategy").unwrap(), OptionValue::Enum("dataflow"));
/// // A typo gets a suggestion; a developer option through the user API says how to opt in.
/// let typo = options.set_str("runtime.fusion_stratgy", "dataflow").unwrap_err();
/// assert!(typo.to_string().contains("did you mean `runtime.fusion_strategy`?"));
/// let dev = options.set_str("cpu_fusion.block_size", "2048").unwrap_err();
/// assert!(matches!(dev, Error::DeveloperOption { .. }));
/// options.set_developer_str("cpu_fusion.block_size", "2048").unwrap();
/// assert_eq!(options.developer_overrides(), vec!["cpu_fusion.block_size=2048".to_string()]);
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Options {
    specs: Vec<OptionSpec>,
    values: Vec<(&'static str, OptionValue)>,
}

// `Options::new()` (every built-in spec) is defined by the front end, which knows the built-in
// executors; the core only knows its own specs.

impl Options {
    /// Options with exactly these specs (for tests and embedders with their own executors), taken
    /// as given: [`declare`](Self::declare) checks each spec ([`OptionSpec::validate`]) where
    /// this does not.
    pub fn with_specs(specs: &[OptionSpec]) -> Self {
        Self { specs: specs.to_vec(), values: Vec::new() }
    }

    /// The runtime's specs only.
    pub fn runtime_only() -> Self {
        Self::with_specs(RUNTIME_OPTIONS)
    }

    /// Adds the specs an executor of yours declares. Declaring a spec again is harmless;
    /// declaring a name again with another type, default, audience or environment variable is
    /// an error, and nothing is added.
    ///
    /// ```
    /// use boundscope::options::{Audience, OptionSpec, OptionType, OptionValue, Options};
    /// use boundscope::Error;
    /// let spec = OptionSpec {
    ///     name: "mine.tile",
    ///     ty: OptionType::Int { min: 1, max: 1024 },
    ///     default: OptionValue::Int(64),
    ///     doc: "Tile size of my executor.",
    ///     audience: Audience::User,
    ///     env: None,
    /// };
    /// let mut options = Options::runtime_only();
    /// options.declare(&[spec.clone()])?;
    /// options.declare(&[spec.clone()])?; // the same again: nothing changes
    /// let other = OptionSpec { default: OptionValue::Int(128), ..spec };
    /// assert!(matches!(options.declare(&[other]), Err(Error::ConflictingOption { .. })));
    /// assert_eq!(options.int("mine.tile")?, 64);
    /// # Ok::<(), boundscope::Error>(())
    /// ```
    ///
    /// # Errors
    /// What [`OptionSpec::validate`] finds wrong with a spec (its name, its type's names, its
    /// default, its environment variable); [`Error::ConflictingOption`] for a name declared
    /// before with another spec, or an environment variable another option reads.
    pub fn declare(&mut self, specs: &[OptionSpec]) -> Result<()> {
        for (i, spec) in specs.iter().enumerate() {
            spec.validate()?;
            let shares_env = |s: &&OptionSpec| s.name != spec.name && s.env.is_some() && s.env == spec.env;
            if let Some(other) = self.specs.iter().chain(&specs[..i]).find(shares_env) {
                return Err(Error::ConflictingOption {
                    name: spec.name.to_string(),
                    detail: format!(
                        "its environment variable `{}` is option `{}`'s already; give it a variable of its own",
                        spec.env.unwrap_or_default(),
                        other.name
                    ),
                });
            }
            let earlier = self.specs.iter().chain(&specs[..i]).find(|s| s.name == spec.name);
            if let Some(earlier) = earlier {
                let differs = [
                    (earlier.ty != spec.ty, "type"),
                    (earlier.default != spec.default, "default"),
                    (earlier.audience != spec.audience, "audience"),
                    (earlier.env != spec.env, "environment variable"),
                ];
                let differs: Vec<&str> = differs.iter().filter(|(d, _)| *d).map(|(_, what)| *what).collect();
                if !differs.is_empty() {
                    return Err(Error::ConflictingOption {
                        name: spec.name.to_string(),
                        detail: format!("another {}", differs.join(", ")),
                    });
                }
            }
        }
        for spec in specs {
            if !self.specs.iter().any(|s| s.name == spec.name) {
                self.specs.push(spec.clone());
            }
        }
        Ok(())
    }

    /// Every spec known to this set.
    pub fn specs(&self) -> &[OptionSpec] {
        &self.specs
    }

    /// The spec of an option.
    ///
    /// # Errors
    /// [`Error::UnknownOption`] with the closest name.
    pub fn spec(&self, name: &str) -> Result<&OptionSpec> {
        self.specs.iter().find(|s| s.name == name).ok_or_else(|| Error::UnknownOption {
            name: name.to_string(),
            suggestion: did_you_mean(name, self.specs.iter().map(|s| s.name)),
        })
    }

    /// Sets a user option.
    ///
    /// # Errors
    /// [`Error::UnknownOption`], [`Error::InvalidOptionValue`], or [`Error::DeveloperOption`]
    /// for a developer option (use [`set_developer`](Self::set_developer)).
    pub fn set(&mut self, name: &str, value: impl Into<OptionValue>) -> Result<()> {
        let spec = self.user_spec(name)?;
        let value = spec.check(&value.into())?;
        self.store(spec.name, value);
        Ok(())
    }

    /// Parses and sets a user option.
    ///
    /// # Errors
    /// As for [`set`](Self::set).
    pub fn set_str(&mut self, name: &str, text: &str) -> Result<()> {
        let spec = self.user_spec(name)?;
        let value = spec.parse(text)?;
        self.store(spec.name, value);
        Ok(())
    }

    /// Sets a developer option (also accepts user options). Plans built with developer options
    /// say so in their listing header.
    ///
    /// # Errors
    /// [`Error::UnknownOption`] or [`Error::InvalidOptionValue`].
    pub fn set_developer(&mut self, name: &str, value: impl Into<OptionValue>) -> Result<()> {
        let spec = self.spec(name)?.clone();
        let value = spec.check(&value.into())?;
        self.store(spec.name, value);
        Ok(())
    }

    /// Parses and sets a developer option (also accepts user options).
    ///
    /// # Errors
    /// As for [`set_developer`](Self::set_developer).
    pub fn set_developer_str(&mut self, name: &str, text: &str) -> Result<()> {
        let spec = self.spec(name)?.clone();
        let value = spec.parse(text)?;
        self.store(spec.name, value);
        Ok(())
    }

    /// The value of an option: set, or its default.
    ///
    /// # Errors
    /// [`Error::UnknownOption`].
    pub fn get(&self, name: &str) -> Result<OptionValue> {
        let spec = self.spec(name)?;
        Ok(self.values.iter().find(|(n, _)| *n == spec.name).map_or_else(|| spec.default.clone(), |(_, v)| v.clone()))
    }

    /// A bool option's value.
    ///
    /// # Errors
    /// [`Error::UnknownOption`], or [`Error::InvalidOptionValue`] if it is not a bool option.
    pub fn bool(&self, name: &str) -> Result<bool> {
        match self.get(name)? {
            OptionValue::Bool(b) => Ok(b),
            other => Err(self.wrong_type(name, "bool", &other)),
        }
    }

    /// An integer option's value.
    ///
    /// # Errors
    /// [`Error::UnknownOption`], or [`Error::InvalidOptionValue`] if it is not an integer option.
    pub fn int(&self, name: &str) -> Result<i64> {
        match self.get(name)? {
            OptionValue::Int(i) => Ok(i),
            other => Err(self.wrong_type(name, "int", &other)),
        }
    }

    /// An enum option's value.
    ///
    /// # Errors
    /// [`Error::UnknownOption`], or [`Error::InvalidOptionValue`] if it is not an enum option.
    pub fn enum_value(&self, name: &str) -> Result<&'static str> {
        match self.get(name)? {
            OptionValue::Enum(e) => Ok(e),
            other => Err(self.wrong_type(name, "enum_value", &other)),
        }
    }

    /// Names of the options that were set, in the order they were first set.
    pub fn set_names(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.values.iter().map(|(n, _)| *n)
    }

    /// `name=value` for every developer option that was set.
    pub fn developer_overrides(&self) -> Vec<String> {
        self.values
            .iter()
            .filter(|(n, _)| self.specs.iter().any(|s| s.name == *n && s.audience == Audience::Developer))
            .map(|(n, v)| format!("{n}={v}"))
            .collect()
    }

    fn user_spec(&self, name: &str) -> Result<OptionSpec> {
        let spec = self.spec(name)?;
        if spec.audience == Audience::Developer {
            return Err(Error::DeveloperOption { name: spec.name.to_string() });
        }
        Ok(spec.clone())
    }

    fn store(&mut self, name: &'static str, value: OptionValue) {
        match self.values.iter_mut().find(|(n, _)| *n == name) {
            Some(slot) => slot.1 = value,
            None => self.values.push((name, value)),
        }
    }

    /// A getter (`Options::getter`) called on an option of another type (`got`, its value):
    /// says which getter reads it.
    fn wrong_type(&self, name: &str, getter: &str, got: &OptionValue) -> Error {
        let (what, reader) = match got {
            OptionValue::Bool(_) => ("a bool", "bool"),
            OptionValue::Int(_) => ("an integer", "int"),
            OptionValue::Enum(_) => ("one name", "enum_value"),
            OptionValue::EnumList(_) => ("a list of names", "get"),
            OptionValue::NameList(_) => ("a list of names", "get"),
        };
        Error::InvalidOptionValue {
            name: name.to_string(),
            expected: format!("{what}, read with `Options::{reader}` (`Options::{getter}` reads another type)"),
            got: got.to_string(),
        }
    }
}

impl fmt::Display for Options {
    /// `name=value` of every option set, comma-separated.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (n, v)) in self.values.iter().enumerate() {
            write!(f, "{}{n}={v}", if i == 0 { "" } else { ", " })?;
        }
        Ok(())
    }
}
