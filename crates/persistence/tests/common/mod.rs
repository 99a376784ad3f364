//! Shared fixtures: a scope, fences by generation, port inputs, and tree comparison.
#![allow(dead_code)]

use omabox_contract::{
    AbortSignal, CheckpointWorkspaceInput, ManagedSandboxLease, MaterializeWorkspaceInput,
    RuntimePublicationCandidate, RuntimeResourceFence, RuntimeResourceScope, SecretString,
    WorkspaceBinding, WorkspaceStrategy,
};
use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

pub fn scope() -> RuntimeResourceScope {
    RuntimeResourceScope::new("ws", "env", "session-1", "work-1")
}

pub fn fence(generation: u64) -> RuntimeResourceFence {
    let scope = scope();
    RuntimeResourceFence {
        workspace_id: scope.workspace_id,
        environment_id: scope.environment_id,
        session_id: scope.session_id,
        work_id: scope.work_id,
        owner_id: "owner".into(),
        generation,
        token: SecretString::new("secret-token"),
        expires_at: "2099-01-01T00:00:00.000Z".into(),
    }
}

pub fn lease() -> ManagedSandboxLease {
    ManagedSandboxLease {
        provider: "local".into(),
        runtime_id: "rt-1".into(),
        metadata: None,
    }
}

pub fn materialize_input(
    generation: u64,
    strategy: WorkspaceStrategy,
    active: Option<RuntimePublicationCandidate>,
) -> MaterializeWorkspaceInput {
    MaterializeWorkspaceInput {
        scope: scope(),
        fence: fence(generation),
        strategy,
        active_checkpoint: active,
        idempotency_key: format!("work-1:{generation}:workspace-materialize"),
        signal: AbortSignal::never(),
    }
}

pub fn checkpoint_input(
    generation: u64,
    strategy: WorkspaceStrategy,
    binding: &WorkspaceBinding,
    key_suffix: &str,
) -> CheckpointWorkspaceInput {
    CheckpointWorkspaceInput {
        scope: scope(),
        fence: fence(generation),
        strategy,
        binding: binding.clone(),
        sandbox: lease(),
        idempotency_key: format!("work-1:{generation}:workspace-checkpoint{key_suffix}"),
        signal: AbortSignal::never(),
    }
}

pub fn host_path(binding: &WorkspaceBinding) -> PathBuf {
    omabox_persistence::binding_host_path(binding.metadata.as_ref()).expect("hostPath")
}

/// What a tree looks like: path → (kind, mode, content or link target).
pub fn describe(root: &Path) -> BTreeMap<String, (String, u32, Vec<u8>)> {
    fn visit(root: &Path, dir: &Path, out: &mut BTreeMap<String, (String, u32, Vec<u8>)>) {
        let mut names: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        names.sort();
        for path in names {
            let rel = path
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            let mode = meta.permissions().mode() & 0o777;
            if meta.file_type().is_symlink() {
                let target = std::fs::read_link(&path).unwrap();
                out.insert(
                    rel,
                    (
                        "symlink".into(),
                        0,
                        target.to_string_lossy().as_bytes().to_vec(),
                    ),
                );
            } else if meta.is_dir() {
                out.insert(rel, ("dir".into(), mode, Vec::new()));
                visit(root, &path, out);
            } else {
                out.insert(rel, ("file".into(), mode, std::fs::read(&path).unwrap()));
            }
        }
    }
    let mut out = BTreeMap::new();
    visit(root, root, &mut out);
    out
}

pub fn set_mode(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// Deterministic pseudo-random bytes.
pub fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 24) as u8
        })
        .collect()
}

/// Number of blobs in the store under `data_dir`.
pub fn blob_count(data_dir: &Path) -> usize {
    let mut count = 0;
    let shards = data_dir.join("blobs/sha256");
    for shard in std::fs::read_dir(shards).unwrap() {
        count += std::fs::read_dir(shard.unwrap().path()).unwrap().count();
    }
    count
}
