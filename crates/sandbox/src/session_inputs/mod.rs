//! [`SandboxSessionInputs`]: the generic Session input materializer (reference §1.10 and the
//! "generic materializer" of §1.15) over any provider's tool sandboxes.
//!
//! ```text
//!   materialize (after attach, before the harness), resources in the session's order:
//!     file              access.download_file(file_id) ─► writeFileBytes(mount_path)
//!     github_repository skipped over an active workspace checkpoint; else exec
//!                       `git clone [--branch B] -- URL DIR` (120 s), commit → `git -C DIR
//!                       checkout --detach SHA` (60 s), GIT_TERMINAL_PROMPT=0
//!     memory_store      host store ─► files under mount_path (default /mnt/memory/<id>/)
//!   synchronize (checkpoints, periodic, final):
//!     memory_store read_write, materializer-owned: scan the sandbox dir ─► host store
//! ```
//!
//! Git runs inside the sandbox, so it goes through the sandbox's own network path: with an
//! enforcing backend, the host must be admitted by the run's networking, and a credential
//! bound by credential egress is injected on the host (the sandbox never holds it).
//!
//! A failure names the resource (`Session resource <type> <where>: <reason>`, the URL
//! without user info, query or fragment) and fails the run; the reference's texts are the
//! reasons. What this must never do: put a credential on a command line, follow a path out
//! of a mount, or trust anything read back from the sandbox (see [`memory`]).

mod git;
pub mod memory;

use crate::managed::ProviderManagedRuntime;
use crate::port::SandboxPort;
use async_trait::async_trait;
use omabox_contract::{
    AbortSignal, ManagedSandboxLease, MaterializeSessionInputsInput, MemoryStoreOwnership,
    PortError, RuntimeSessionResourceSnapshot, SessionInputLifecycleContext,
    SessionInputMaterializerPort,
};
use std::sync::Arc;

pub use memory::{MemoryFile, MemoryStoreHost, MemoryStoreLimits};

/// `file`.
pub const FILE: &str = "file";
/// `github_repository`.
pub const GITHUB_REPOSITORY: &str = "github_repository";
/// `memory_store`.
pub const MEMORY_STORE: &str = "memory_store";
/// Where memory stores are mounted unless a resource says otherwise.
pub const MEMORY_ROOT: &str = "/mnt/memory";

/// How long reading one memory store back may take (the sandbox may stall it).
const SCAN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

/// The live tool sandbox of a lease.
#[async_trait]
pub trait LeaseSandboxes: Send + Sync {
    /// The sandbox `lease` names (live, this provider's).
    async fn sandbox(&self, lease: &ManagedSandboxLease)
    -> Result<Arc<dyn SandboxPort>, PortError>;
}

#[async_trait]
impl LeaseSandboxes for ProviderManagedRuntime {
    async fn sandbox(
        &self,
        lease: &ManagedSandboxLease,
    ) -> Result<Arc<dyn SandboxPort>, PortError> {
        ProviderManagedRuntime::sandbox(self, lease).await
    }
}

/// Who synchronizes memory stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MemoryStorePolicy {
    /// As the host says (`resourceOwnership.memoryStore`): worker-owned stores are skipped
    /// by both calls.
    #[default]
    FollowHost,
    /// This materializer owns every memory store, whatever the lane: for a host whose
    /// `ama_worker` lane runs arbitrary commands that know nothing of memory stores
    /// (`omabox run`).
    AlwaysMaterializer,
}

/// The generic materializer (module doc).
#[derive(Clone)]
pub struct SandboxSessionInputs {
    provider: String,
    sandboxes: Arc<dyn LeaseSandboxes>,
    memory: Option<Arc<dyn MemoryStoreHost>>,
    memory_policy: MemoryStorePolicy,
    limits: MemoryStoreLimits,
}

impl std::fmt::Debug for SandboxSessionInputs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SandboxSessionInputs")
            .field("provider", &self.provider)
            .field("memory", &self.memory.is_some())
            .field("memory_policy", &self.memory_policy)
            .finish_non_exhaustive()
    }
}

impl SandboxSessionInputs {
    /// A materializer for `provider`'s sandboxes (the name goes into the reference's
    /// "<provider> cannot …" texts). Without [`with_memory_stores`](Self::with_memory_stores)
    /// a materializer-owned memory store fails as the reference's generic one does.
    pub fn new(provider: impl Into<String>, sandboxes: Arc<dyn LeaseSandboxes>) -> Self {
        Self {
            provider: provider.into(),
            sandboxes,
            memory: None,
            memory_policy: MemoryStorePolicy::FollowHost,
            limits: MemoryStoreLimits::default(),
        }
    }

    /// Memory stores live in `host`, under `policy`.
    pub fn with_memory_stores(
        mut self,
        host: Arc<dyn MemoryStoreHost>,
        policy: MemoryStorePolicy,
    ) -> Self {
        self.memory = Some(host);
        self.memory_policy = policy;
        self
    }

    /// Caps on what a synchronization reads back from the sandbox.
    pub fn with_memory_limits(mut self, limits: MemoryStoreLimits) -> Self {
        self.limits = limits;
        self
    }

    fn owns_memory(&self, context: &SessionInputLifecycleContext) -> bool {
        match self.memory_policy {
            MemoryStorePolicy::AlwaysMaterializer => true,
            MemoryStorePolicy::FollowHost => {
                context.resource_ownership.memory_store == MemoryStoreOwnership::Materializer
            }
        }
    }

    async fn materialize_one(
        &self,
        sandbox: &Arc<dyn SandboxPort>,
        input: &MaterializeSessionInputsInput,
        resource: &RuntimeSessionResourceSnapshot,
    ) -> Result<(), PortError> {
        let context = &input.context;
        match resource.resource_type.as_str() {
            MEMORY_STORE => {
                if !self.owns_memory(context) {
                    return Ok(());
                }
                let store = memory::MemoryResource::parse(resource)?;
                let host = self.memory_host()?;
                memory::hydrate(sandbox.as_ref(), host.as_ref(), &store, &context.signal).await
            }
            FILE => self.materialize_file(sandbox, context, resource).await,
            GITHUB_REPOSITORY => {
                if input.active_workspace_checkpoint.is_some() {
                    // Never re-clone over resumed state.
                    return Ok(());
                }
                let clone = git::GitClone::parse(resource)?;
                git::clone(sandbox.as_ref(), &clone, &context.signal).await
            }
            other => Err(PortError::new(format!(
                "Unsupported Session resource type: {other}"
            ))),
        }
    }

    async fn materialize_file(
        &self,
        sandbox: &Arc<dyn SandboxPort>,
        context: &SessionInputLifecycleContext,
        resource: &RuntimeSessionResourceSnapshot,
    ) -> Result<(), PortError> {
        let access = context.access.as_ref().ok_or_else(|| {
            PortError::new("Session file materialization requires per-claim SessionInputAccessPort")
        })?;
        let bytes_port = sandbox.as_file_bytes().ok_or_else(|| {
            PortError::capability(format!(
                "{} cannot materialize binary Session files",
                self.provider
            ))
        })?;
        let file_id = resource
            .str_field("file_id")
            .filter(|id| !id.is_empty())
            .ok_or_else(|| PortError::new("Session file resource requires file_id"))?;
        let mount_path = mount_path(resource)?;
        let file = access
            .download_file(file_id, context.signal.clone())
            .await?;
        context.signal.throw_if_aborted()?;
        bytes_port
            .write_file_bytes(mount_path, &file.content)
            .await?;
        Ok(())
    }

    fn memory_host(&self) -> Result<&Arc<dyn MemoryStoreHost>, PortError> {
        self.memory.as_ref().ok_or_else(|| {
            PortError::new(format!(
                "{} generic Session input materializer does not implement memory_store synchronization",
                self.provider
            ))
        })
    }
}

#[async_trait]
impl SessionInputMaterializerPort for SandboxSessionInputs {
    async fn materialize(&self, input: MaterializeSessionInputsInput) -> Result<(), PortError> {
        let context = &input.context;
        if context.session.resources.is_empty() {
            return Ok(());
        }
        context.signal.throw_if_aborted()?;
        let sandbox = self.sandboxes.sandbox(&context.sandbox).await?;
        for resource in &context.session.resources {
            context.signal.throw_if_aborted()?;
            self.materialize_one(&sandbox, &input, resource)
                .await
                .map_err(|error| named(resource, error, &context.signal))?;
        }
        Ok(())
    }

    async fn synchronize(
        &self,
        context: SessionInputLifecycleContext,
        _idempotency_key: String,
    ) -> Result<(), PortError> {
        if !self.owns_memory(&context) {
            return Ok(());
        }
        let writable: Vec<_> = context
            .session
            .resources
            .iter()
            .filter(|r| r.resource_type == MEMORY_STORE)
            .filter(|r| r.str_field("access") != Some("read_only"))
            .collect();
        if writable.is_empty() {
            return Ok(());
        }
        context.signal.throw_if_aborted()?;
        let sandbox = self.sandboxes.sandbox(&context.sandbox).await?;
        for resource in writable {
            let result = async {
                let store = memory::MemoryResource::parse(resource)?;
                let host = self.memory_host()?;
                let scan = memory::scan(sandbox.as_ref(), &store, &self.limits, &context.signal);
                let files = tokio::time::timeout(SCAN_TIMEOUT, scan)
                    .await
                    .map_err(|_| PortError::new("scan Session Memory failed: timed out"))??;
                authorize(&context).await?;
                host.replace(&store.id, files).await
            }
            .await;
            result.map_err(|error| named(resource, error, &context.signal))?;
        }
        Ok(())
    }
}

/// Checks `resource` as materializing it would, without a sandbox: its type, mount path,
/// store id, URL and checkout (the reference's texts, prefixed with the resource). For a
/// caller that refuses a bad session before it claims anything; `file` ids are the access
/// port's to resolve.
pub fn validate(resource: &RuntimeSessionResourceSnapshot) -> Result<(), PortError> {
    let checked = match resource.resource_type.as_str() {
        MEMORY_STORE => memory::MemoryResource::parse(resource).map(drop),
        GITHUB_REPOSITORY => git::GitClone::parse(resource).map(drop),
        FILE => resource
            .str_field("file_id")
            .filter(|id| !id.is_empty())
            .ok_or_else(|| PortError::new("Session file resource requires file_id"))
            .and_then(|_| mount_path(resource).map(drop)),
        other => Err(PortError::new(format!(
            "Unsupported Session resource type: {other}"
        ))),
    };
    checked.map_err(|error| {
        PortError::with_kind(
            error.kind(),
            format!("Session resource {}: {}", label(resource), error.message()),
        )
    })
}

/// Re-validates the fence right before a canonical mutation (writing a host store back).
async fn authorize(context: &SessionInputLifecycleContext) -> Result<(), PortError> {
    if (context.authorize)().await? {
        Ok(())
    } else {
        Err(PortError::new(
            "Runtime resource fence lost during Session input synchronization",
        ))
    }
}

/// `error` prefixed with the resource it concerns (an abort stays the abort).
fn named(
    resource: &RuntimeSessionResourceSnapshot,
    error: PortError,
    signal: &AbortSignal,
) -> PortError {
    if signal.is_aborted() {
        return error;
    }
    PortError::with_kind(
        error.kind(),
        format!("Session resource {}: {}", label(resource), error.message()),
    )
}

/// `<type> <where>`: the mount path, the store id or the URL without credentials.
pub fn label(resource: &RuntimeSessionResourceSnapshot) -> String {
    let kind = &resource.resource_type;
    let place = match kind.as_str() {
        GITHUB_REPOSITORY => resource.str_field("url").map(git::display_url),
        MEMORY_STORE => resource.str_field("memory_store_id").map(str::to_owned),
        _ => resource.str_field("mount_path").map(str::to_owned),
    };
    match place {
        Some(place) => format!("{kind} {}", sanitize(&place)),
        None => kind.clone(),
    }
}

/// At most 200 characters, no control characters (the text reaches a terminal).
fn sanitize(text: &str) -> String {
    text.chars().filter(|c| !c.is_control()).take(200).collect()
}

/// The resource's `mount_path`, checked (reference text).
fn mount_path(resource: &RuntimeSessionResourceSnapshot) -> Result<&str, PortError> {
    resource
        .str_field("mount_path")
        .filter(|path| valid_mount_path(path))
        .ok_or_else(|| {
            PortError::new(
                "Session resource mount_path must be absolute and may not traverse parents",
            )
        })
}

/// Absolute, no `..` segment, no NUL.
pub fn valid_mount_path(path: &str) -> bool {
    path.starts_with('/') && !path.contains('\0') && !path.split('/').any(|segment| segment == "..")
}

/// `'text'` for a POSIX shell: single quotes escaped as `'"'"'`.
pub fn shell_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r#"'"'"'"#))
}

#[cfg(test)]
mod tests;
