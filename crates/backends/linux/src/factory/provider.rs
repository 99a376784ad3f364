//! [`LinuxSandboxProvider`]: the provider trio (create, resume, restore) over the
//! factory. Must never hand out a sandbox another process started, nor accept another
//! provider's handle or checkpoint.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use async_trait::async_trait;
use omabox_contract::PortError;
use omabox_sandbox::{
    SandboxCheckpointHandle, SandboxFactoryContext, SandboxFactoryEnv, SandboxPort,
    SandboxProviderPort, SandboxRuntimeHandle,
};

use crate::port::{LinuxSandboxPort, PROVIDER};

use super::LinuxSandboxFactory;

/// The provider trio over [`LinuxSandboxFactory`].
///
/// - `create` starts a sandbox (as the factory does) and remembers it, weakly;
/// - `resume` hands back a sandbox this provider created that is still alive in this
///   process (a linux sandbox's agent serves exactly one connection, owned by the
///   process that started it, so no other process can reattach to it);
/// - `restore` rejects every checkpoint: linux sandboxes take none.
///
/// Another provider's handle or checkpoint is rejected by name.
#[derive(Debug, Default)]
pub struct LinuxSandboxProvider {
    factory: LinuxSandboxFactory,
    live: Mutex<HashMap<String, Weak<LinuxSandboxPort>>>,
}

impl LinuxSandboxProvider {
    /// A provider over `factory`.
    pub fn new(factory: LinuxSandboxFactory) -> Self {
        Self {
            factory,
            live: Mutex::new(HashMap::new()),
        }
    }

    fn live(&self) -> std::sync::MutexGuard<'_, HashMap<String, Weak<LinuxSandboxPort>>> {
        self.live.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[async_trait]
impl SandboxProviderPort for LinuxSandboxProvider {
    async fn create(
        &self,
        ctx: &SandboxFactoryContext,
        env: &SandboxFactoryEnv,
    ) -> Result<Arc<dyn SandboxPort>, PortError> {
        let port = Arc::new(self.factory.create_port(ctx, env).await?);
        let mut live = self.live();
        live.retain(|_, weak| weak.strong_count() > 0);
        live.insert(port.id().to_owned(), Arc::downgrade(&port));
        Ok(port)
    }

    async fn resume(
        &self,
        handle: &SandboxRuntimeHandle,
        _ctx: &SandboxFactoryContext,
        _env: &SandboxFactoryEnv,
    ) -> Result<Arc<dyn SandboxPort>, PortError> {
        if handle.provider != PROVIDER {
            return Err(PortError::invalid_argument(format!(
                "runtime handle of provider {:?} cannot be resumed by the {PROVIDER} provider",
                handle.provider
            )));
        }
        let port = self
            .live()
            .get(&handle.runtime_id)
            .and_then(Weak::upgrade)
            .filter(|port| port.is_alive());
        match port {
            Some(port) => Ok(port),
            None => Err(PortError::new(format!(
                "linux sandbox {:?} is not running in this process (linux sandboxes cannot be \
                 reattached from another process)",
                handle.runtime_id
            ))),
        }
    }

    async fn restore(
        &self,
        checkpoint: &SandboxCheckpointHandle,
        _ctx: &SandboxFactoryContext,
        _env: &SandboxFactoryEnv,
    ) -> Result<Arc<dyn SandboxPort>, PortError> {
        if checkpoint.provider != PROVIDER {
            return Err(PortError::invalid_argument(format!(
                "checkpoint of provider {:?} cannot be restored by the {PROVIDER} provider",
                checkpoint.provider
            )));
        }
        Err(PortError::invalid_argument(format!(
            "linux sandboxes take no checkpoints, so {:?} cannot be restored",
            checkpoint.checkpoint_id
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::factory::tests::{ctx, env};

    #[tokio::test]
    async fn the_provider_rejects_foreign_and_unknown_handles() {
        use omabox_sandbox::{SandboxCheckpointKind, SandboxCheckpointScope};
        let provider = LinuxSandboxProvider::default();
        let foreign = SandboxRuntimeHandle {
            provider: "e2b".into(),
            runtime_id: "x".into(),
        };
        let e = provider
            .resume(&foreign, &ctx(), &env(&[]))
            .await
            .err()
            .unwrap();
        assert!(e.message().contains("\"e2b\""), "{e}");
        let unknown = SandboxRuntimeHandle {
            provider: "linux".into(),
            runtime_id: "nope".into(),
        };
        let e = provider
            .resume(&unknown, &ctx(), &env(&[]))
            .await
            .err()
            .unwrap();
        assert!(e.message().contains("not running in this process"), "{e}");
        let mut checkpoint = SandboxCheckpointHandle {
            provider: "daytona".into(),
            checkpoint_id: "c".into(),
            source_runtime_id: "r".into(),
            kind: SandboxCheckpointKind::Filesystem,
            scope: SandboxCheckpointScope::Portable,
            metadata: None,
        };
        let e = provider
            .restore(&checkpoint, &ctx(), &env(&[]))
            .await
            .err()
            .unwrap();
        assert!(e.message().contains("\"daytona\""), "{e}");
        checkpoint.provider = "linux".into();
        let e = provider
            .restore(&checkpoint, &ctx(), &env(&[]))
            .await
            .err()
            .unwrap();
        assert!(e.message().contains("take no checkpoints"), "{e}");
    }
}
