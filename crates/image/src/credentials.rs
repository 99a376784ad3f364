//! Registry credentials: a user name and a password for one registry host, from a
//! docker `config.json` (its credential helpers, or `auths.<host>.auth`, base64
//! `user:password`) or any other [`CredentialSource`] the caller plugs in (the CLI's
//! vault).
//!
//! Must never: print, log or serialize a password (its `Debug` is redacted and it has
//! no `Display`), nor put one into an error text; an error names the file, never its
//! content.

use std::fmt;
use std::path::{Path, PathBuf};

use base64::Engine as _;

use crate::cred_helper::HelperPath;

/// A user name and password for one registry.
#[derive(Clone, PartialEq, Eq)]
pub struct RegistryCredential {
    /// The user name.
    pub username: String,
    password: String,
}

impl RegistryCredential {
    /// A credential.
    pub fn new(username: impl Into<String>, password: impl Into<String>) -> Self {
        Self {
            username: username.into(),
            password: password.into(),
        }
    }

    /// The password, for the one place that sends it.
    pub fn expose_password(&self) -> &str {
        &self.password
    }

    /// Parses `user:password` (the decoded form of docker's `auth`).
    pub fn from_user_colon_password(text: &str) -> Option<Self> {
        let (user, password) = text.split_once(':')?;
        (!user.is_empty()).then(|| Self::new(user, password))
    }
}

impl fmt::Debug for RegistryCredential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegistryCredential")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// Where credentials come from. `registry` is `host[:port]` (`index.docker.io` for
/// Docker Hub). `Err` is a reason without any secret in it.
pub trait CredentialSource: Send + Sync + fmt::Debug {
    /// The credential for `registry`, if this source has one.
    fn credential(&self, registry: &str) -> Result<Option<RegistryCredential>, String>;
}

/// Docker's client configuration file (`$DOCKER_CONFIG/config.json`, else
/// `~/.docker/config.json`), asked as docker asks it: the registry's `credHelpers`
/// helper, else the `credsStore` helper (`cred_helper`), else `auths.<host>.auth` (or
/// `username`/`password`).
#[derive(Debug, Clone)]
pub struct DockerConfig {
    path: PathBuf,
    helpers: HelperPath,
}

impl DockerConfig {
    /// The file at `path`.
    pub fn at(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            helpers: HelperPath::default(),
        }
    }

    /// The same file, with its credential helpers looked up in `path` (a `PATH`-style list;
    /// without one, a helper the file names is reported as not found).
    pub fn with_helper_path(mut self, path: impl Into<std::ffi::OsString>) -> Self {
        self.helpers = HelperPath(Some(path.into()));
        self
    }

    /// Docker's default location from `DOCKER_CONFIG` and `HOME` (values given, so the
    /// caller decides which environment is read). `None` when neither is set.
    pub fn default_location(docker_config: Option<&str>, home: Option<&str>) -> Option<Self> {
        match (docker_config.filter(|d| !d.is_empty()), home) {
            (Some(dir), _) => Some(Self::at(Path::new(dir).join("config.json"))),
            (None, Some(home)) if !home.is_empty() => {
                Some(Self::at(Path::new(home).join(".docker/config.json")))
            }
            _ => None,
        }
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// The most of a docker config file that is read (docker's own are a few KiB).
const MAX_DOCKER_CONFIG: u64 = 4 << 20;

/// A docker config file's bytes: a regular file (never a FIFO or device that would block
/// or stream forever) of at most [`MAX_DOCKER_CONFIG`] bytes.
fn read_config(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    // Non-blocking: opening a FIFO for reading would otherwise wait for a writer.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    if !file.metadata()?.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    let mut text = Vec::new();
    file.take(MAX_DOCKER_CONFIG + 1).read_to_end(&mut text)?;
    if text.len() as u64 > MAX_DOCKER_CONFIG {
        return Err(std::io::Error::other(format!(
            "larger than {} MiB",
            MAX_DOCKER_CONFIG >> 20
        )));
    }
    Ok(text)
}

impl CredentialSource for DockerConfig {
    fn credential(&self, registry: &str) -> Result<Option<RegistryCredential>, String> {
        let text = match read_config(&self.path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("cannot read {}: {e}", self.path.display())),
        };
        let config: serde_json::Value = serde_json::from_slice(&text)
            .map_err(|_| format!("{} is not valid JSON", self.path.display()))?;
        let wanted = normalize_host(registry);
        let helper = config
            .get("credHelpers")
            .and_then(|h| h.as_object())
            .and_then(|h| h.iter().find(|(key, _)| normalize_host(key) == wanted))
            .map(|(_, name)| name)
            .or_else(|| config.get("credsStore"))
            .and_then(|name| name.as_str())
            .filter(|name| !name.is_empty());
        if let Some(name) = helper {
            // Docker Hub's credentials are stored under its v1 URL.
            let server = if wanted == "index.docker.io" {
                "https://index.docker.io/v1/"
            } else {
                registry
            };
            if let Some(c) = crate::cred_helper::get(name, server, &self.helpers)? {
                return Ok(Some(c));
            }
        }
        let Some(auths) = config.get("auths").and_then(|a| a.as_object()) else {
            return Ok(None);
        };
        let Some(entry) = auths
            .iter()
            .find(|(key, _)| normalize_host(key) == wanted)
            .map(|(_, v)| v)
        else {
            return Ok(None);
        };
        let invalid = || {
            format!(
                "{}: the entry for {registry} is not a base64 `user:password`",
                self.path.display()
            )
        };
        if let Some(auth) = entry.get("auth").and_then(|a| a.as_str()) {
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(auth.trim())
                .map_err(|_| invalid())?;
            let text = String::from_utf8(decoded).map_err(|_| invalid())?;
            return RegistryCredential::from_user_colon_password(&text)
                .map(Some)
                .ok_or_else(invalid);
        }
        match (
            entry.get("username").and_then(|u| u.as_str()),
            entry.get("password").and_then(|p| p.as_str()),
        ) {
            (Some(user), Some(password)) => Ok(Some(RegistryCredential::new(user, password))),
            _ => Ok(None),
        }
    }
}

/// `https://index.docker.io/v1/` → `index.docker.io`; `docker.io` → `index.docker.io`;
/// `host:5000` stays.
fn normalize_host(key: &str) -> String {
    let key = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    let host = key.split('/').next().unwrap_or(key).to_ascii_lowercase();
    match host.as_str() {
        "docker.io" | "registry-1.docker.io" | "registry.hub.docker.com" => {
            "index.docker.io".into()
        }
        _ => host,
    }
}

/// Credentials held in memory, by registry host (the CLI fills it from its vault:
/// secrets named `registry/<host[:port]>` holding `user:password`). `Debug` shows the hosts
/// and user names only.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StaticCredentials(pub std::collections::BTreeMap<String, RegistryCredential>);

impl CredentialSource for StaticCredentials {
    fn credential(&self, registry: &str) -> Result<Option<RegistryCredential>, String> {
        Ok(self.0.get(registry).cloned())
    }
}

/// Several sources, asked in order; the first credential wins.
#[derive(Debug, Default)]
pub struct CredentialChain(pub Vec<Box<dyn CredentialSource>>);

impl CredentialSource for CredentialChain {
    fn credential(&self, registry: &str) -> Result<Option<RegistryCredential>, String> {
        for source in &self.0 {
            if let Some(c) = source.credential(registry)? {
                return Ok(Some(c));
            }
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docker_config_auths_are_found_by_host_and_never_printed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.json");
        let auth = base64::engine::general_purpose::STANDARD.encode("alice:s3cret-pw");
        std::fs::write(
            &path,
            format!(
                r#"{{"auths":{{"127.0.0.1:5000":{{"auth":"{auth}"}},"https://index.docker.io/v1/":{{"auth":"{auth}"}}}}}}"#
            ),
        )
        .unwrap();
        let config = DockerConfig::at(&path);
        let c = config.credential("127.0.0.1:5000").unwrap().unwrap();
        assert_eq!(c.username, "alice");
        assert_eq!(c.expose_password(), "s3cret-pw");
        assert!(!format!("{c:?}").contains("s3cret"));
        assert!(config.credential("index.docker.io").unwrap().is_some());
        assert!(config.credential("other:5000").unwrap().is_none());
        std::fs::write(&path, r#"{"auths":{"h":{"auth":"!!"}}}"#).unwrap();
        assert!(config.credential("h").is_err());
    }

    #[test]
    fn a_docker_config_that_is_huge_or_no_regular_file_is_refused_not_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.json");
        let file = std::fs::File::create(&path).unwrap();
        file.set_len(MAX_DOCKER_CONFIG + 1).unwrap();
        let error = DockerConfig::at(&path).credential("h").unwrap_err();
        assert!(error.contains("larger than 4 MiB"), "{error}");
        // A FIFO would block the pull forever on read.
        std::fs::remove_file(&path).unwrap();
        nix_mkfifo(&path);
        let error = DockerConfig::at(&path).credential("h").unwrap_err();
        assert!(error.contains("not a regular file"), "{error}");
    }

    fn nix_mkfifo(path: &Path) {
        let status = std::process::Command::new("mkfifo")
            .arg(path)
            .status()
            .unwrap();
        assert!(status.success());
    }

    #[test]
    fn cred_helpers_come_before_creds_store_before_auths() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        for (name, user) in [("per", "per-registry"), ("store", "store")] {
            let helper = dir.path().join(format!("docker-credential-{name}"));
            let script = format!(
                "#!/bin/sh\nread -r s\n[ \"$s\" = nothing ] && {{ echo 'credentials not found'; exit 1; }}\nprintf '{{\"Username\":\"{user}\",\"Secret\":\"pw-%s\"}}' \"$s\"\n"
            );
            std::fs::write(&helper, script).unwrap();
            std::fs::set_permissions(&helper, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let path = dir.path().join("config.json");
        let auth = base64::engine::general_purpose::STANDARD.encode("file:file-pw");
        std::fs::write(
            &path,
            format!(
                r#"{{"credsStore":"store","credHelpers":{{"reg.example":"per"}},"auths":{{"nothing":{{"auth":"{auth}"}}}}}}"#
            ),
        )
        .unwrap();
        let config = DockerConfig::at(&path).with_helper_path(dir.path());
        let c = config.credential("reg.example").unwrap().unwrap();
        assert_eq!(
            (c.username.as_str(), c.expose_password()),
            ("per-registry", "pw-reg.example")
        );
        let c = config.credential("other:5000").unwrap().unwrap();
        assert_eq!(
            (c.username.as_str(), c.expose_password()),
            ("store", "pw-other:5000")
        );
        let c = config.credential("docker.io").unwrap().unwrap();
        assert_eq!(c.expose_password(), "pw-https://index.docker.io/v1/");
        // The store has nothing for it: auths answers.
        let c = config.credential("nothing").unwrap().unwrap();
        assert_eq!(
            (c.username.as_str(), c.expose_password()),
            ("file", "file-pw")
        );
        // The search path is the configuration's `PATH`, never the process's: without one
        // the helper is not found; from a registry configuration's environment it is.
        let error = DockerConfig::at(&path)
            .credential("reg.example")
            .unwrap_err();
        assert_eq!(
            error,
            "credential helper docker-credential-per is not on PATH"
        );
        let docker_dir = dir.path().to_str().unwrap().to_owned();
        let registry = crate::RegistryConfig::from_env(|key| match key {
            "DOCKER_CONFIG" => Some(docker_dir.clone()),
            "PATH" => Some(format!("/nonexistent:{docker_dir}")),
            _ => None,
        })
        .unwrap();
        let c = registry
            .credentials
            .unwrap()
            .credential("reg.example")
            .unwrap()
            .unwrap();
        assert_eq!(c.username, "per-registry");
    }
}
