//! Where things live under the data directory, and the "stays under its root" check.
//!
//! ```text
//! <data-dir>/blobs/…                                           the blob store (see `blob`)
//! <data-dir>/runtime/<scopeDir>/<generation>/wsb_<32 hex>/     a workspace binding root
//!     workspace/                                               bind-mounted at /workspace
//!     stat-cache.json                                          incremental-checkpoint cache
//!     checkpoints/<32 hex>.json                                candidate per idempotency key
//! <data-dir>/runtime-outputs/<scopeDir>/<generation>/outb_<32 hex>/
//!     outputs/                                                 bind-mounted at /mnt/session/outputs
//! ```
//!
//! `scopeDir` is the SHA-256 of the four scope ids joined by NUL; binding ids are `wsb_` /
//! `outb_` plus the first 32 hex digits of SHA-256 of the idempotency key. Binding paths are
//! always recomputed from (scope, generation, binding id), never taken from binding metadata.

use crate::error::{PersistenceError, Result};
use crate::hash::{BlobHash, has_hex_suffix, short_hash};
use omabox_contract::{Meta, RuntimeResourceScope};
use std::path::{Component, Path, PathBuf};

/// `root` joined with `parts`, refusing any part that is not a plain name.
pub(crate) fn rooted(root: &Path, parts: &[&str]) -> Result<PathBuf> {
    let mut path = root.to_path_buf();
    for part in parts {
        let mut components = Path::new(part).components();
        match (components.next(), components.next()) {
            (Some(Component::Normal(_)), None) => path.push(part),
            _ => return Err(PersistenceError::EscapedRoot),
        }
    }
    Ok(path)
}

/// SHA-256 of the scope key (four ids joined by NUL).
pub(crate) fn scope_dir(scope: &RuntimeResourceScope) -> String {
    BlobHash::of(scope.key().as_bytes()).to_hex()
}

/// The id of the binding made for `idempotency_key`.
pub(crate) fn binding_id(prefix: &str, idempotency_key: &str) -> String {
    format!("{prefix}{}", short_hash(idempotency_key))
}

/// The binding root of `binding_id` (checked to be `<prefix><32 hex>`).
pub(crate) fn binding_root(
    data_dir: &Path,
    area: &str,
    prefix: &str,
    scope: &RuntimeResourceScope,
    generation: u64,
    binding_id: &str,
) -> Result<PathBuf> {
    if !has_hex_suffix(binding_id, prefix, 32) {
        return Err(PersistenceError::UnknownBinding(binding_id.to_owned()));
    }
    rooted(
        data_dir,
        &[area, &scope_dir(scope), &generation.to_string(), binding_id],
    )
}

/// Checks that binding metadata, when present, names the path we recomputed.
pub(crate) fn check_host_path(
    metadata: Option<&Meta>,
    expected: &Path,
    binding_id: &str,
) -> Result<()> {
    let named = metadata
        .and_then(|meta| meta.get("hostPath"))
        .and_then(|value| value.as_str());
    match named {
        Some(path) if Path::new(path) != expected => {
            Err(PersistenceError::UnknownBinding(binding_id.to_owned()))
        }
        _ => Ok(()),
    }
}

/// `{hostPath, bindingRoot}`: the binding metadata a host-directory backend bind-mounts from.
pub(crate) fn binding_metadata(host_path: &Path, binding_root: &Path) -> Meta {
    let mut meta = Meta::new();
    meta.insert(
        "hostPath".into(),
        host_path.to_string_lossy().into_owned().into(),
    );
    meta.insert(
        "bindingRoot".into(),
        binding_root.to_string_lossy().into_owned().into(),
    );
    meta
}

/// The host directory a binding's metadata names (`hostPath`), for backends that bind it.
pub fn binding_host_path(metadata: Option<&Meta>) -> Option<PathBuf> {
    metadata
        .and_then(|meta| meta.get("hostPath"))
        .and_then(|value| value.as_str())
        .map(PathBuf::from)
}

/// Removes the (now possibly empty) generation and scope directories above a binding root
/// (also used by the node's leftover sweep).
pub fn prune_empty_parents(binding_root: &Path) {
    let mut dir = binding_root.parent();
    for _ in 0..2 {
        let Some(current) = dir else { return };
        if std::fs::remove_dir(current).is_err() {
            return;
        }
        dir = current.parent();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rooted_refuses_traversal_and_absolute_parts() {
        let root = Path::new("/data");
        assert_eq!(rooted(root, &["a", "b"]).unwrap(), Path::new("/data/a/b"));
        for bad in ["..", "/etc", "a/b", ".", ""] {
            assert!(
                matches!(rooted(root, &[bad]), Err(PersistenceError::EscapedRoot)),
                "{bad:?}"
            );
        }
        assert!(matches!(
            binding_root(
                root,
                "runtime",
                "wsb_",
                &RuntimeResourceScope::new("w", "e", "s", "k"),
                1,
                "wsb_../x"
            ),
            Err(PersistenceError::UnknownBinding(_))
        ));
    }
}
