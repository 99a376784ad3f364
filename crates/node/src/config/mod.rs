//! The node configuration: every setting omabox reads, built once per command from the
//! command line's flags, the process environment and a configuration file, in that order of
//! precedence (flag > environment > file > default), each value remembering where it came
//! from.
//!
//! ```text
//!   defs.rs    the table: key, flag, variables, default, description, secret, parser
//!   low.rs     the sources: Flags (from the CLI), Environment (read once), ConfigFile (TOML)
//!   mod.rs     NodeConfig: the merge, raw values and their sources, checked values
//!   high.rs    typed settings: paths, limits, the linux backend's config (and env map)
//!   report.rs  what `omabox config` prints, and the generated reference
//! ```
//!
//! The configuration file: `--config FILE` or `OMABOX_CONFIG`, else `<data_dir>/omabox.toml`
//! when it exists; one file, TOML, its keys the settings' names (`linux_memory = "1G"`);
//! unknown keys are refused; it must belong to this user (or root) and be writable by nobody
//! else, since it can name what runs (`linux_init`, binds into every sandbox).
//!
//! A bad value fails only what uses it, with its name, value and source
//! ([`ConfigError::Invalid`]); `omabox config` lists every bad value. What this must never
//! do: print a secret's value (errors and reports say `(set, hidden)`), or read the process
//! environment anywhere but [`Environment::of_process`].

pub mod defs;
mod high;
pub mod low;
pub mod report;

pub use defs::{Key, Kind, SETTINGS, Setting};
pub use low::{ConfigFile, Environment, Flags};

use omabox_contract::SecretString;
use std::path::{Path, PathBuf};

/// Where a value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// The command line.
    Flag,
    /// This environment variable.
    Env(&'static str),
    /// This configuration file.
    File(PathBuf),
    /// The setting's default.
    Default,
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Flag => f.write_str("flag"),
            Self::Env(name) => write!(f, "env:{name}"),
            Self::File(path) => write!(f, "file:{}", path.display()),
            Self::Default => f.write_str("default"),
        }
    }
}

impl Source {
    /// `flag`, `env`, `file PATH` or `default`: an error names the variable or flag already.
    pub fn short(&self) -> String {
        match self {
            Self::Flag => "flag".into(),
            Self::Env(_) => "env".into(),
            Self::File(path) => format!("file {}", path.display()),
            Self::Default => "default".into(),
        }
    }
}

/// A setting that cannot be used, or a configuration file that cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// `NAME="VALUE" is invalid (SOURCE): REASON` (a secret's value hidden).
    #[error("{name}={value} is invalid ({}): {reason}", origin.short())]
    Invalid {
        /// The variable, flag or file key the value was given as.
        name: String,
        /// The value, quoted (or `(set, hidden)`).
        value: String,
        /// Where it came from.
        origin: Source,
        /// Why it cannot be used.
        reason: String,
    },
    /// The configuration file cannot be used.
    #[error("the configuration file {}: {reason}", path.display())]
    File {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
}

/// A value as given (flag, environment or file) and its source.
#[derive(Clone)]
struct Given {
    value: String,
    /// As given (a path may be any bytes; `value` is its lossy text).
    raw: std::ffi::OsString,
    source: Source,
}

/// The merged configuration of one command (module doc).
#[derive(Clone)]
pub struct NodeConfig {
    given: Vec<Option<Given>>,
    env: Environment,
    file: Option<PathBuf>,
    root: bool,
}

impl std::fmt::Debug for NodeConfig {
    // Values may be secrets: what is set, and from where.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let set: Vec<String> = Key::ALL
            .iter()
            .filter(|&&key| self.given[key as usize].is_some())
            .map(|&key| format!("{}: {}", key.name(), self.source(key)))
            .collect();
        f.debug_struct("NodeConfig")
            .field("set", &set)
            .field("file", &self.file)
            .finish_non_exhaustive()
    }
}

impl NodeConfig {
    /// The configuration of this process: `flags` (the command line's), its environment
    /// (read here, once) and the configuration file they name or the data dir holds.
    pub fn load(flags: &Flags) -> Result<Self, ConfigError> {
        Self::from_sources(flags, Environment::of_process())
    }

    /// The configuration of `flags` and `env` (and the file they name or the data dir holds).
    pub fn from_sources(flags: &Flags, env: Environment) -> Result<Self, ConfigError> {
        let root = rustix::process::geteuid().is_root();
        // Which file: named by flag or environment, else the data dir's (named the same way).
        let early = |key| low::pick(key, flags, &env, None).map(|(value, _)| value);
        let file = match early(Key::Config) {
            Some(path) => {
                if path.is_empty() {
                    let config = Self::merge(flags, env, None, root);
                    return Err(config.invalid(Key::Config, "is empty: name a file"));
                }
                Some(ConfigFile::load(Path::new(&path), false)?)
            }
            None => match crate::data_dir::choose(
                early(Key::DataDir).as_deref().map(Path::new),
                early(Key::XdgDataHome).as_deref(),
                early(Key::Home).as_deref(),
            ) {
                Ok(dir) => {
                    let path = dir.join(crate::data_dir::CONFIG_FILE);
                    match std::fs::symlink_metadata(&path) {
                        Ok(_) => {
                            // Read only from a data dir no other user can change.
                            crate::data_dir::trusted(&dir).map_err(|e| ConfigError::File {
                                path: path.clone(),
                                reason: format!("{e:#}"),
                            })?;
                            Some(ConfigFile::load(&path, true)?)
                        }
                        Err(_) => None,
                    }
                }
                // No data dir can be named: nothing to read there (the command says why
                // when it needs one).
                Err(_) => None,
            },
        };
        Ok(Self::merge(flags, env, file.as_ref(), root))
    }

    fn merge(flags: &Flags, env: Environment, file: Option<&ConfigFile>, root: bool) -> Self {
        let given = Key::ALL
            .iter()
            .map(|&key| {
                low::pick(key, flags, &env, file).map(|(raw, source)| Given {
                    value: raw.to_string_lossy().into_owned(),
                    raw,
                    source,
                })
            })
            .collect();
        Self {
            given,
            env,
            file: file.map(|f| f.path.clone()),
            root,
        }
    }

    /// The configuration file read, if any.
    pub fn file(&self) -> Option<&Path> {
        self.file.as_deref()
    }

    /// The environment snapshot (for variables a serve configuration names).
    pub fn environment(&self) -> &Environment {
        &self.env
    }

    /// `key`'s value as given (flag, environment or file), unchecked; `None`: its default.
    /// A secret given in the environment is not kept: [`Self::secret`] reads it.
    pub fn given(&self, key: Key) -> Option<&str> {
        self.given[key as usize].as_ref().map(|g| g.value.as_str())
    }

    /// Whether `key` was given (a secret too).
    pub fn is_set(&self, key: Key) -> bool {
        self.source(key) != Source::Default
    }

    /// A secret's value, read now (from the environment; a flag's was kept), never kept.
    pub fn secret(&self, key: Key) -> Option<SecretString> {
        if let Some(value) = self.given(key) {
            return Some(SecretString::new(value));
        }
        key.setting()
            .env
            .iter()
            .find_map(|name| self.env.get(name))
            .map(|value| SecretString::new(value.to_string_lossy()))
    }

    /// `key`'s value as given, as bytes (a path), when set and not empty.
    pub fn given_os(&self, key: Key) -> Option<&std::ffi::OsStr> {
        self.given[key as usize]
            .as_ref()
            .map(|g| g.raw.as_os_str())
            .filter(|v| !v.is_empty())
    }

    /// `key`'s value as given and not blank, unchecked.
    pub fn given_nonempty(&self, key: Key) -> Option<&str> {
        self.given(key).filter(|v| !v.trim().is_empty())
    }

    /// Where `key`'s value comes from (a secret's variables are looked at now).
    pub fn source(&self, key: Key) -> Source {
        if let Some(given) = &self.given[key as usize] {
            return given.source.clone();
        }
        let setting = key.setting();
        if setting.secret
            && let Some(name) = setting.env.iter().find(|name| self.env.get(name).is_some())
        {
            return Source::Env(name);
        }
        Source::Default
    }

    /// `key`'s value as given, checked by its parser; `None`: its default. A secret is
    /// checked by [`Self::checked_secret`].
    pub fn checked(&self, key: Key) -> Result<Option<&str>, ConfigError> {
        let Some(value) = self.given(key) else {
            return Ok(None);
        };
        (key.setting().parse)(value).map_err(|reason| self.invalid(key, &reason))?;
        Ok(Some(value))
    }

    /// A secret's value (read now), checked by its parser.
    pub fn checked_secret(&self, key: Key) -> Result<Option<SecretString>, ConfigError> {
        let Some(value) = self.secret(key) else {
            return Ok(None);
        };
        (key.setting().parse)(value.expose()).map_err(|reason| self.invalid(key, &reason))?;
        Ok(Some(value))
    }

    /// `key`'s value parsed by `parse` (after its own parser); `None`: its default.
    pub fn parsed<T>(
        &self,
        key: Key,
        parse: impl FnOnce(&str) -> Result<T, String>,
    ) -> Result<Option<T>, ConfigError> {
        match self.checked(key)? {
            Some(value) => parse(value).map(Some).map_err(|r| self.invalid(key, &r)),
            None => Ok(None),
        }
    }

    /// Why `key`'s value cannot be used, if it cannot.
    pub fn problem(&self, key: Key) -> Option<ConfigError> {
        match key.setting().secret {
            true => self.checked_secret(key).err(),
            false => self.checked(key).err(),
        }
    }

    /// Every bad value, in table order.
    pub fn problems(&self) -> Vec<ConfigError> {
        Key::ALL
            .iter()
            .filter_map(|&key| self.problem(key))
            .collect()
    }

    /// The error for `key`'s given value.
    pub fn invalid(&self, key: Key, reason: &str) -> ConfigError {
        let setting = key.setting();
        let source = self.source(key);
        let name = match &source {
            Source::Env(name) => (*name).to_owned(),
            Source::Flag => setting
                .flag
                .and_then(|f| f.split([' ', ',']).next())
                .unwrap_or(setting.name)
                .to_owned(),
            Source::File(_) | Source::Default => setting.name.to_owned(),
        };
        let value = match self.given(key) {
            _ if setting.secret && self.is_set(key) => "(set, hidden)".to_owned(),
            Some(value) => format!("{:?}", report::without_url_credentials(value)),
            None => "(unset)".to_owned(),
        };
        ConfigError::Invalid {
            name,
            value,
            origin: source,
            reason: reason.trim_start_matches("is ").to_owned(),
        }
    }
}

#[cfg(test)]
mod tests;
