//! Runtime identity and runtime-checkpoint compatibility (reference §2.5, steps 16 and 33).
//!
//! A runtime checkpoint may only warm-start a run whose harness is materially the same
//! process. The identity is stable JSON of the declared process — command, args and cwd only
//! when declared, and the *names* of its environment variables, never their values:
//! environment values commonly carry per-work credentials, and the identity is persisted in
//! checkpoint refs and publications.

use omabox_contract::json::stable_json;
use omabox_contract::{
    HarnessDriverDeclaration, ManagedRuntimeProfile, ManagedSandboxLease, RuntimeCheckpointKind,
    RuntimeCheckpointRef, RuntimeProcessDeclaration, RuntimeResourceScope,
};
use serde_json::{Map, Value, json};

/// `harnessVersion` of every `ama_worker` lane.
pub const AMA_WORKER_HARNESS_VERSION: &str = "ama-worker-v1";

/// `Number.MAX_SAFE_INTEGER`: counters above it cannot round-trip through the TypeScript host.
const MAX_SAFE_INTEGER: u64 = (1 << 53) - 1;

/// The `{harnessVersion, runtimeIdentity}` pair of a profile's harness.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeIdentity {
    /// `harness.version` (supervised) or `"ama-worker-v1"`.
    pub harness_version: String,
    /// Stable JSON of the harness process identity.
    pub runtime_identity: String,
}

impl RuntimeIdentity {
    /// Step 8: the identity of `profile.driver`.
    pub fn of(profile: &ManagedRuntimeProfile) -> Self {
        match &profile.driver {
            HarnessDriverDeclaration::OpenmaSupervised {
                supervisor,
                harness,
                ..
            } => Self {
                harness_version: harness.version.clone(),
                runtime_identity: stable_json(&json!({
                    "type": profile.driver.driver_type().as_str(),
                    "id": harness.id,
                    "version": harness.version,
                    "supervisor": process_identity(supervisor),
                })),
            },
            HarnessDriverDeclaration::AmaWorker { process } => Self {
                harness_version: AMA_WORKER_HARNESS_VERSION.to_owned(),
                runtime_identity: stable_json(&json!({
                    "type": profile.driver.driver_type().as_str(),
                    "process": process_identity(process),
                })),
            },
        }
    }
}

/// `{command, args?, cwd?, envKeys}` with env names sorted and values dropped.
fn process_identity(process: &RuntimeProcessDeclaration) -> Value {
    let mut identity = Map::new();
    identity.insert("command".into(), Value::from(process.command.clone()));
    if let Some(args) = &process.args {
        identity.insert("args".into(), Value::from(args.clone()));
    }
    if let Some(cwd) = &process.cwd {
        identity.insert("cwd".into(), Value::from(cwd.clone()));
    }
    // BTreeMap keys are already sorted (byte order; equal to JS `sort()` for ASCII names).
    let env_keys: Vec<Value> = process
        .env
        .iter()
        .flat_map(|env| env.keys().cloned().map(Value::from))
        .collect();
    identity.insert("envKeys".into(), Value::Array(env_keys));
    Value::Object(identity)
}

/// Step 16: may the published checkpoint warm-start this generation?
pub fn is_reusable(
    checkpoint: Option<&RuntimeCheckpointRef>,
    scope: &RuntimeResourceScope,
    fence_generation: u64,
    kind: RuntimeCheckpointKind,
    identity: &RuntimeIdentity,
) -> bool {
    let Some(checkpoint) = checkpoint else {
        return false;
    };
    checkpoint.kind == kind
        && checkpoint.session_id == scope.session_id
        && checkpoint.work_generation < fence_generation
        && checkpoint.harness_version == identity.harness_version
        && checkpoint.runtime_identity == identity.runtime_identity
        && !checkpoint.provider.is_empty()
        && !checkpoint.checkpoint_id.is_empty()
        && !checkpoint.source_runtime_id.is_empty()
        && checkpoint.workspace_revision <= MAX_SAFE_INTEGER
        && checkpoint.work_generation <= MAX_SAFE_INTEGER
}

/// What a freshly created checkpoint ref must echo (step 33).
#[derive(Debug)]
pub struct CreatedCheckpointExpectation<'a> {
    /// The plan's kind.
    pub kind: RuntimeCheckpointKind,
    /// The lease the checkpoint was taken from.
    pub lease: &'a ManagedSandboxLease,
    /// The work item.
    pub scope: &'a RuntimeResourceScope,
    /// The fence generation.
    pub generation: u64,
    /// The harness identity.
    pub identity: &'a RuntimeIdentity,
    /// The workspace candidate's revision.
    pub workspace_revision: u64,
}

impl CreatedCheckpointExpectation<'_> {
    /// True when the ref matches on every identity field.
    pub fn is_met_by(&self, checkpoint: &RuntimeCheckpointRef) -> bool {
        checkpoint.kind == self.kind
            && checkpoint.provider == self.lease.provider
            && checkpoint.source_runtime_id == self.lease.runtime_id
            && checkpoint.session_id == self.scope.session_id
            && checkpoint.work_generation == self.generation
            && checkpoint.harness_version == self.identity.harness_version
            && checkpoint.runtime_identity == self.identity.runtime_identity
            && checkpoint.workspace_revision == self.workspace_revision
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use omabox_contract::{
        CredentialEgressProfile, HarnessIdentity, OutputRequirement, OutputsProfile,
        RuntimeCheckpointRequirement, SupervisorProtocol, WorkspaceProfile, WorkspaceRequirement,
    };
    use std::collections::BTreeMap;

    fn profile(driver: HarnessDriverDeclaration) -> ManagedRuntimeProfile {
        ManagedRuntimeProfile {
            workspace: WorkspaceProfile {
                requirement: WorkspaceRequirement::Durable,
                preferred_strategies: None,
            },
            outputs: OutputsProfile {
                requirement: OutputRequirement::Disabled,
                preferred_strategies: None,
            },
            runtime_checkpoint: RuntimeCheckpointRequirement::Optional,
            credential_egress: None::<CredentialEgressProfile>,
            driver,
        }
    }

    #[test]
    fn ama_worker_identity_matches_the_reference_example() {
        let mut process = RuntimeProcessDeclaration::command("node");
        process.args = Some(vec!["worker.mjs".into()]);
        let identity =
            RuntimeIdentity::of(&profile(HarnessDriverDeclaration::AmaWorker { process }));
        assert_eq!(identity.harness_version, "ama-worker-v1");
        assert_eq!(
            identity.runtime_identity,
            r#"{"process":{"args":["worker.mjs"],"command":"node","envKeys":[]},"type":"ama_worker"}"#
        );
    }

    #[test]
    fn identity_keeps_env_names_and_drops_values() {
        let mut process = RuntimeProcessDeclaration::command("sup");
        process.cwd = Some("/workspace/project".into());
        process.env = Some(BTreeMap::from([
            ("ZED".to_owned(), "secret-z".to_owned()),
            ("ALPHA".to_owned(), "secret-a".to_owned()),
        ]));
        let identity = RuntimeIdentity::of(&profile(HarnessDriverDeclaration::OpenmaSupervised {
            protocol: SupervisorProtocol::V1,
            supervisor: process,
            harness: HarnessIdentity {
                id: "pi".into(),
                version: "1.2".into(),
            },
            ready_timeout_ms: 1,
            heartbeat_timeout_ms: 1,
            drain_timeout_ms: 1,
        }));
        assert_eq!(identity.harness_version, "1.2");
        assert_eq!(
            identity.runtime_identity,
            r#"{"id":"pi","supervisor":{"command":"sup","cwd":"/workspace/project","envKeys":["ALPHA","ZED"]},"type":"openma_supervised","version":"1.2"}"#
        );
        assert!(!identity.runtime_identity.contains("secret"));
    }
}
