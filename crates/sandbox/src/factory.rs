//! `SandboxFactory`: how the host turns a session into a sandbox, and the test-mode rule.

use crate::port::SandboxPort;
use async_trait::async_trait;
use omabox_contract::PortError;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

/// `{sessionId, workdir, memoryRoot?, outputsRoot?}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxFactoryContext {
    /// The session the sandbox serves.
    pub session_id: String,
    /// Host directory backing the sandbox's `/workspace`.
    pub workdir: PathBuf,
    /// Host directory backing memory stores, when configured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_root: Option<PathBuf>,
    /// Host directory backing `/mnt/session/outputs`, when configured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outputs_root: Option<PathBuf>,
}

/// A read-only snapshot of the process environment, handed to factories.
///
/// Each factory reads only its own keys (`E2B_API_KEY`, `SANDBOX_IMAGE`, …); the host never
/// branches on them and passes the map through untouched.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct SandboxFactoryEnv {
    vars: BTreeMap<String, String>,
}

impl std::fmt::Debug for SandboxFactoryEnv {
    // Values may be secrets (API keys): print the keys only.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SandboxFactoryEnv")
            .field("keys", &self.vars.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl SandboxFactoryEnv {
    /// A snapshot of this process's environment. Variables whose name or value is not
    /// UTF-8 are left out.
    pub fn from_process_env() -> Self {
        std::env::vars_os()
            .filter_map(|(key, value)| Some((key.into_string().ok()?, value.into_string().ok()?)))
            .collect()
    }

    /// The value of `key`, if set.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.vars.get(key).map(String::as_str)
    }

    /// This map with `key` set to `value` (the host adds keys it decided, e.g. a policy
    /// from a command line flag).
    #[must_use]
    pub fn with_var(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.vars.insert(key.into(), value.into());
        self
    }

    /// Every key, sorted.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.vars.keys().map(String::as_str)
    }
}

impl<K: Into<String>, V: Into<String>> FromIterator<(K, V)> for SandboxFactoryEnv {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        Self {
            vars: iter
                .into_iter()
                .map(|(key, value)| (key.into(), value.into()))
                .collect(),
        }
    }
}

/// omabox's test-mode flag: `OMABOX_TEST_MODE=1`.
pub const TEST_MODE_ENV: &str = "OMABOX_TEST_MODE";
/// OpenMA's test-mode flag, accepted for drop-in compatibility: `NODE_ENV=test`.
pub const NODE_ENV: &str = "NODE_ENV";

/// True when `OMABOX_TEST_MODE=1` or `NODE_ENV=test`. Nothing else turns test mode on.
pub fn is_test_mode(env: &SandboxFactoryEnv) -> bool {
    env.get(TEST_MODE_ENV) == Some("1") || env.get(NODE_ENV) == Some("test")
}

/// `SandboxFactory = (ctx, env) => Promise<SandboxPort>`: one backend's entry point.
#[async_trait]
pub trait SandboxFactory: Send + Sync {
    /// Creates the session's sandbox. Reads only this backend's own keys from `env`.
    async fn create(
        &self,
        ctx: &SandboxFactoryContext,
        env: &SandboxFactoryEnv,
    ) -> Result<Arc<dyn SandboxPort>, PortError>;
}
