//! Typed settings: what the node's services ask the configuration for. Each is the table's
//! value (checked) or its default, computed in one place.

use super::defs::{Key, SETTINGS, SettingDefault};
use super::{ConfigError, NodeConfig, Source};
use crate::data_dir::{self, DataDir};
use omabox_backend_linux::factory::{LinuxFactoryError, LinuxSandboxConfig, LinuxSandboxFactory};
use omabox_persistence::CheckpointLimits;
use omabox_sandbox::SandboxFactoryEnv;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::time::Duration;

impl NodeConfig {
    /// `key`'s value: as given, else its default (`None`: unset, or decided where it is used).
    pub fn value(&self, key: Key) -> Option<String> {
        match self.given(key) {
            Some(value) => Some(value.to_owned()),
            None => self.default_of(key),
        }
    }

    /// `key`'s default on this machine (`None`: unset, or decided where it is used).
    pub fn default_of(&self, key: Key) -> Option<String> {
        match key.setting().default {
            SettingDefault::Value(value) => Some(value.to_owned()),
            SettingDefault::None | SettingDefault::Described(_) => None,
            SettingDefault::Computed(_) => {
                let path = match key {
                    Key::DataDir => self.data_dir_choice().ok(),
                    Key::Config => self
                        .data_dir_choice()
                        .ok()
                        .map(|d| d.join(data_dir::CONFIG_FILE))
                        .filter(|p| p.exists()),
                    Key::AgentCache => self
                        .data_dir_choice()
                        .ok()
                        .map(|d| d.join(data_dir::AGENTS)),
                    Key::BlobDir => self.data_dir_choice().ok().map(|d| d.join(data_dir::BLOBS)),
                    Key::ImageCache => Some(self.default_image_cache()),
                    Key::DockerConfig => self.os(Key::Home).map(|h| Path::new(h).join(".docker")),
                    _ => None,
                };
                path.map(|p| p.display().to_string())
            }
        }
    }

    /// `key`'s given value as an OS string (paths may be any bytes), when set and not empty.
    fn os(&self, key: Key) -> Option<&OsStr> {
        self.given_os(key)
    }

    /// The data directory as named (flag, environment, file, else the XDG/HOME default),
    /// not resolved and not checked.
    pub fn data_dir_choice(&self) -> anyhow::Result<PathBuf> {
        let explicit = self.os(Key::DataDir).map(Path::new);
        if explicit.is_none() && self.given(Key::DataDir).is_some() {
            anyhow::bail!(
                "{}",
                self.invalid(Key::DataDir, "is empty: name a directory")
            );
        }
        data_dir::choose(explicit, self.os(Key::XdgDataHome), self.os(Key::Home))
    }

    /// The data directory, resolved and checked ([`DataDir::resolve`]), with the blob
    /// directory `blob_dir` names (resolved and checked the same way) when it is set.
    pub fn data_dir(&self) -> anyhow::Result<DataDir> {
        let data_dir = DataDir::resolve(&self.data_dir_choice()?)?;
        match self.checked(Key::BlobDir)? {
            Some(_) => {
                let chosen = self
                    .os(Key::BlobDir)
                    .map(Path::new)
                    .unwrap_or(Path::new(""));
                Ok(data_dir.with_blob_dir(data_dir::trusted(chosen)?))
            }
            None => Ok(data_dir),
        }
    }

    fn default_image_cache(&self) -> PathBuf {
        data_dir::default_image_cache(
            self.root,
            self.os(Key::XdgCacheHome),
            self.os(Key::Home),
            &self.tmp_dir(),
        )
    }

    /// The image cache: the `image_cache` setting (absolute), else the default.
    pub fn image_cache(&self) -> Result<PathBuf, ConfigError> {
        match self.checked(Key::ImageCache)?.map(str::trim) {
            Some(dir) if !dir.is_empty() => Ok(PathBuf::from(dir)),
            _ => Ok(self.default_image_cache()),
        }
    }

    /// The agent package cache of `data_dir`: the `agent_cache` setting, else
    /// `<data_dir>/agents`.
    pub fn agent_cache(&self, data_dir: &DataDir) -> Result<PathBuf, ConfigError> {
        let configured = self.checked(Key::AgentCache)?.map(Path::new);
        Ok(data_dir.agent_cache(configured))
    }

    /// The linux runtime dir the `linux_runtime_dir` setting names (absolute; else, as the
    /// factory does, the default `/run/omabox`), for a caller that needs it before it has
    /// the factory's settings (a one-shot sandbox's PID 1 is forked first).
    pub fn linux_runtime_dir(&self) -> PathBuf {
        self.given_nonempty(Key::LinuxRuntimeDir)
            .map(|dir| PathBuf::from(dir.trim()))
            .filter(|dir| dir.is_absolute())
            .unwrap_or_else(|| omabox_backend_linux::RuntimeConfig::default().runtime_dir)
    }

    /// Where temporary directories go: `TMPDIR`, else `/tmp` (as `std::env::temp_dir`).
    pub fn tmp_dir(&self) -> PathBuf {
        self.os(Key::Tmpdir)
            .map_or_else(|| PathBuf::from("/tmp"), PathBuf::from)
    }

    /// A whole-number setting (its parser checked the range), else its default.
    pub fn number(&self, key: Key) -> Result<Option<u64>, ConfigError> {
        let value = self.parsed(key, whole)?;
        Ok(value.or_else(|| self.default_of(key).and_then(|d| d.parse().ok())))
    }

    /// A duration in milliseconds, if given.
    pub fn millis(&self, key: Key) -> Result<Option<Duration>, ConfigError> {
        Ok(self.parsed(key, whole)?.map(Duration::from_millis))
    }

    /// Revisions kept per session by a collection.
    pub fn gc_keep(&self) -> Result<u64, ConfigError> {
        Ok(self.number(Key::GcKeep)?.unwrap_or(5))
    }

    /// The per-checkpoint limits (entries, bytes).
    pub fn checkpoint_limits(&self) -> Result<CheckpointLimits, ConfigError> {
        let mut limits = CheckpointLimits::default();
        if let Some(entries) = self.parsed(Key::CheckpointMaxEntries, whole)? {
            limits.max_entries = entries;
        }
        if let Some(bytes) = self.parsed(Key::CheckpointMaxBytes, |v| {
            crate::checkpoint_limits::parse_bytes(v).ok_or_else(String::new)
        })? {
            limits.max_bytes = bytes;
        }
        Ok(limits)
    }

    /// Test mode: `test_mode` is `1` or `node_env` is `test`.
    pub fn is_test_mode(&self) -> bool {
        self.given(Key::TestMode) == Some("1") || self.given(Key::NodeEnv) == Some("test")
    }

    /// The value the linux factory's key `key` has in these settings: a `factory` setting
    /// that was given, under the variable it came from (a flag's or a file's value under
    /// the setting's first variable). The node's settings as the factory's parsers read
    /// them, without a map in between ([`Self::linux_config`]).
    pub fn factory_value(&self, key: &str) -> Option<&str> {
        self.factory_settings()
            .find_map(|(name, given)| (name == key).then_some(given))
    }

    /// Every factory setting that was given, under the variable it came from (a flag's or
    /// a file's value under the setting's first variable).
    fn factory_settings(&self) -> impl Iterator<Item = (&'static str, &str)> {
        SETTINGS
            .iter()
            .filter(|setting| setting.factory)
            .filter_map(|setting| {
                let given = self.given(setting.key)?;
                let name = match self.source(setting.key) {
                    Source::Env(name) => name,
                    _ => setting.env[0],
                };
                Some((name, given))
            })
    }

    /// The linux backend's typed settings (limits, network, binds, image still to be
    /// prepared, runtime dir, cgroup parent, init binary) from these settings, with the
    /// image cache the node resolved when none was given (so the backend never derives
    /// its own from the process environment). A bad value names its variable.
    pub fn linux_config(
        &self,
        factory: &LinuxSandboxFactory,
    ) -> Result<LinuxSandboxConfig, LinuxFactoryError> {
        factory
            .clone()
            .with_image_cache(self.default_image_cache())
            .config_from_lookup(&|key| self.factory_value(key))
    }

    /// [`Self::linux_config`] with `image` as the sandboxes' root filesystem (E2B templates
    /// that name an image), every other setting as given.
    pub fn linux_config_with_image(
        &self,
        factory: &LinuxSandboxFactory,
        image: &str,
    ) -> Result<LinuxSandboxConfig, LinuxFactoryError> {
        let image_keys = SETTINGS
            .iter()
            .find(|setting| setting.key == Key::Image)
            .map_or(&[][..], |setting| setting.env);
        factory
            .clone()
            .with_image_cache(self.default_image_cache())
            .config_from_lookup(&|key| {
                if image_keys.contains(&key) {
                    Some(image)
                } else {
                    self.factory_value(key)
                }
            })
    }

    /// The linux factory's env map: every factory setting that was given, under the variable
    /// it came from (a flag's or a file's value under the setting's first variable), and the
    /// image cache the node resolved when none was given. Only for what still takes a map
    /// (the local backend's test mode, the `SANDBOX_PROVIDER` map of `omabox sandbox run`
    /// for other backend names); omabox's own linux sandboxes use [`Self::linux_config`].
    pub fn factory_env(&self) -> SandboxFactoryEnv {
        let env: SandboxFactoryEnv = self.factory_settings().collect();
        match self.given(Key::ImageCache) {
            Some(_) => env,
            None => env.with_var(
                omabox_backend_linux::factory::IMAGE_CACHE_ENV,
                self.default_image_cache().to_string_lossy(),
            ),
        }
    }
}

/// A whole number (the table's parser checked its range).
fn whole(value: &str) -> Result<u64, String> {
    value
        .trim()
        .parse()
        .map_err(|_| "is not a whole number".to_owned())
}
