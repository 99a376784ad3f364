//! Where setting values come from, before they are merged: the command line's flags (given
//! by the CLI, which parsed them), the process environment (read once, here), and the node
//! configuration file (TOML whose keys are the settings' names).
//!
//! What this must never do: accept a file key it does not know, or print a value (the
//! snapshot's `Debug` shows names only).

use super::defs::{Key, SETTINGS};
use super::{ConfigError, Source};
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// The largest configuration file read.
const FILE_MAX: u64 = 1 << 20;

/// Values the command line gave, by setting (the CLI maps each flag to its setting).
#[derive(Debug, Clone, Default)]
pub struct Flags {
    values: BTreeMap<Key, OsString>,
}

impl Flags {
    /// No flags.
    pub fn new() -> Self {
        Self::default()
    }

    /// `key` was given on the command line as `value`.
    #[must_use]
    pub fn with(mut self, key: Key, value: impl Into<OsString>) -> Self {
        self.values.insert(key, value.into());
        self
    }

    /// `key`'s value when `value` is given.
    #[must_use]
    pub fn with_some(self, key: Key, value: Option<impl Into<OsString>>) -> Self {
        match value {
            Some(value) => self.with(key, value),
            None => self,
        }
    }

    /// `key`'s value as given (any bytes: a path).
    pub(super) fn get(&self, key: Key) -> Option<&OsString> {
        self.values.get(&key)
    }
}

/// The process environment's variables, as far as omabox reads them.
///
/// The table's variables that are not secrets are read once, when the configuration is
/// loaded; a secret (an API key, the operator key) and any other variable (one a serve
/// configuration's card names) only when asked for, and never kept. So nothing secret is in
/// this process's memory before something needs it: `omabox sandbox run` forks its
/// sandbox's PID 1 right after loading the configuration, and that PID 1 must hold nothing
/// of the host's secrets.
#[derive(Clone, Default)]
pub struct Environment {
    /// Read at load (`None`: unset); a name not here is read from the process when asked
    /// (`process`), else it is unset.
    vars: BTreeMap<String, Option<OsString>>,
    process: bool,
}

impl std::fmt::Debug for Environment {
    // Values may be secrets: the names only.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Environment")
            .field("names", &self.vars.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl Environment {
    /// This process's environment (see the type's doc for what is read when): with
    /// [`Self::get`], the only reads of the process environment below the CLI (the test
    /// hooks excepted).
    pub fn of_process() -> Self {
        let vars = kept_variables()
            .map(|name| (name.to_owned(), std::env::var_os(name)))
            .collect();
        Self {
            vars,
            process: true,
        }
    }

    /// The variable `name`, if set.
    pub fn get(&self, name: &str) -> Option<OsString> {
        match self.vars.get(name) {
            Some(value) => value.clone(),
            None if self.process => std::env::var_os(name),
            None => None,
        }
    }

    /// The variable `name` as UTF-8 text, if set and not empty.
    pub fn text(&self, name: &str) -> Option<String> {
        self.get(name)?.into_string().ok().filter(|v| !v.is_empty())
    }
}

/// The variables read when the configuration loads: the table's, but not the secrets'.
fn kept_variables() -> impl Iterator<Item = &'static str> {
    SETTINGS
        .iter()
        .filter(|s| !s.secret)
        .flat_map(|s| s.env.iter().copied())
}

/// An environment of exactly these variables (tests, and callers that are not this
/// process).
impl<K: Into<String>, V: Into<OsString>> FromIterator<(K, V)> for Environment {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        Self {
            vars: iter
                .into_iter()
                .map(|(name, value)| (name.into(), Some(value.into())))
                .collect(),
            process: false,
        }
    }
}

/// A configuration file, read and checked.
#[derive(Debug, Clone)]
pub struct ConfigFile {
    /// Where it is.
    pub path: PathBuf,
    values: BTreeMap<Key, String>,
}

impl ConfigFile {
    /// Reads the TOML file at `path`; `in_data_dir`: it is the data dir's own file, which
    /// cannot move the data dir. Unknown keys are refused, naming them.
    pub fn load(path: &Path, in_data_dir: bool) -> Result<Self, ConfigError> {
        let file_error = |reason: String| ConfigError::File {
            path: path.to_path_buf(),
            reason,
        };
        check_trusted(path).map_err(file_error)?;
        let text = read_capped(path).map_err(file_error)?;
        Self::parse(path, &text, in_data_dir)
    }

    /// The file `path` holding `text`.
    pub fn parse(path: &Path, text: &str, in_data_dir: bool) -> Result<Self, ConfigError> {
        let file_error = |reason: String| ConfigError::File {
            path: path.to_path_buf(),
            reason,
        };
        let table: toml::Table = text
            .parse()
            .map_err(|e: toml::de::Error| file_error(format!("not TOML: {}", e.message())))?;
        let unknown: Vec<&str> = table
            .keys()
            .map(String::as_str)
            .filter(|name| {
                !SETTINGS
                    .iter()
                    .any(|s| s.name == *name && s.key != Key::Config)
            })
            .collect();
        if !unknown.is_empty() {
            return Err(file_error(format!(
                "unknown key{} {} (`omabox config` lists the settings)",
                if unknown.len() == 1 { "" } else { "s" },
                unknown.join(", ")
            )));
        }
        let mut values = BTreeMap::new();
        for (name, value) in table {
            let Some(setting) = SETTINGS.iter().find(|s| s.name == name) else {
                continue;
            };
            if setting.secret {
                return Err(file_error(format!(
                    "{name} is a secret: give it in the environment ({}), never in a file",
                    setting.env.join(" or ")
                )));
            }
            if setting.key == Key::DataDir && in_data_dir {
                return Err(file_error(
                    "data_dir cannot be set in the data directory's own file (use --config FILE or OMABOX_CONFIG)".into(),
                ));
            }
            let value = match value {
                toml::Value::String(text) => text,
                toml::Value::Integer(n) => n.to_string(),
                toml::Value::Float(x) => x.to_string(),
                toml::Value::Boolean(b) => if b { "1" } else { "0" }.to_owned(),
                _ => {
                    return Err(file_error(format!(
                        "{name} must be a string, a number or a boolean"
                    )));
                }
            };
            values.insert(setting.key, value);
        }
        Ok(Self {
            path: path.to_path_buf(),
            values,
        })
    }

    pub(super) fn get(&self, key: Key) -> Option<&str> {
        self.values.get(&key).map(String::as_str)
    }
}

/// A configuration file may set anything omabox runs (the init binary, binds into every
/// sandbox): it is read only when it is a regular file of this user or root that nobody
/// else may write.
fn check_trusted(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt as _;
    let meta = std::fs::metadata(path).map_err(|e| format!("cannot read it: {e}"))?;
    if !meta.is_file() {
        return Err("is not a regular file".into());
    }
    let me = rustix::process::geteuid().as_raw();
    if meta.uid() != me && meta.uid() != 0 {
        return Err(format!(
            "belongs to uid {}, not to this user (uid {me}) or root: its owner could change what omabox runs",
            meta.uid()
        ));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(format!(
            "is writable by other users (mode {:o}): they could change what omabox runs; `chmod go-w` it",
            meta.mode() & 0o7777
        ));
    }
    Ok(())
}

fn read_capped(path: &Path) -> Result<String, String> {
    use std::io::Read as _;
    let file = std::fs::File::open(path).map_err(|e| format!("cannot read it: {e}"))?;
    let mut text = String::new();
    file.take(FILE_MAX + 1)
        .read_to_string(&mut text)
        .map_err(|e| format!("cannot read it as UTF-8 text: {e}"))?;
    if text.len() as u64 > FILE_MAX {
        return Err(format!("is larger than {FILE_MAX} bytes"));
    }
    Ok(text)
}

/// One setting's value and where it came from: flag, else the first environment variable
/// that is set, else the file, else `None` (the default applies). A secret's variables are
/// not read here (`NodeConfig::secret` reads them when asked).
pub(super) fn pick(
    key: Key,
    flags: &Flags,
    env: &Environment,
    file: Option<&ConfigFile>,
) -> Option<(OsString, Source)> {
    let setting = key.setting();
    if let Some(value) = flags.get(key) {
        return Some((value.clone(), Source::Flag));
    }
    if setting.secret {
        return None;
    }
    for name in setting.env {
        if let Some(value) = env.get(name) {
            return Some((value, Source::Env(name)));
        }
    }
    let file = file?;
    let value = file.get(key)?;
    Some((value.into(), Source::File(file.path.clone())))
}
