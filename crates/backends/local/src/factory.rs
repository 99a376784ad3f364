//! `LocalSubprocessFactory`: the `local-subprocess` entry of the provider map.

use crate::error::LocalSandboxError;
use crate::sandbox::{DEFAULT_EXEC_TIMEOUT_MS, LocalSubprocessOptions, LocalSubprocessSandbox};
use async_trait::async_trait;
use omabox_contract::PortError;
use omabox_sandbox::{
    SandboxFactory, SandboxFactoryContext, SandboxFactoryEnv, SandboxPort, is_test_mode,
};
use std::sync::Arc;

/// Creates [`LocalSubprocessSandbox`]es, and refuses to outside test mode.
///
/// Reads only the test-mode keys (`OMABOX_TEST_MODE`, `NODE_ENV`) from the env. The context's
/// `memoryRoot` is ignored: this backend has no memory mounts.
#[derive(Debug, Clone)]
pub struct LocalSubprocessFactory {
    default_timeout_ms: u64,
}

impl Default for LocalSubprocessFactory {
    fn default() -> Self {
        Self {
            default_timeout_ms: DEFAULT_EXEC_TIMEOUT_MS,
        }
    }
}

impl LocalSubprocessFactory {
    /// A factory with the default exec timeout.
    pub fn new() -> Self {
        Self::default()
    }

    /// A factory whose sandboxes use `default_timeout_ms` for exec.
    pub fn with_default_timeout_ms(default_timeout_ms: u64) -> Self {
        Self { default_timeout_ms }
    }
}

#[async_trait]
impl SandboxFactory for LocalSubprocessFactory {
    async fn create(
        &self,
        ctx: &SandboxFactoryContext,
        env: &SandboxFactoryEnv,
    ) -> Result<Arc<dyn SandboxPort>, PortError> {
        if !is_test_mode(env) {
            return Err(LocalSandboxError::NotTestMode.into());
        }
        let options = LocalSubprocessOptions {
            workdir: ctx.workdir.clone(),
            outputs_root: ctx.outputs_root.clone(),
            default_timeout_ms: self.default_timeout_ms,
        };
        let sandbox = tokio::task::spawn_blocking(move || LocalSubprocessSandbox::new(options))
            .await
            .map_err(|error| {
                PortError::new(format!("local sandbox setup task failed: {error}"))
            })??;
        Ok(Arc::new(sandbox))
    }
}
