//! The session vocabulary the commands share: session ids as users type them, the store
//! that holds sessions, and a session's last publication. A session is one work item
//! (`omabox_host::work_item::session_scope`); the policy lives in the host, not here.
//!
//! What this must never do: accept a session id that could be a path or carry spaces into a
//! URL (ids are `[A-Za-z0-9._-]{1,128}`).

use crate::store_choice::ChosenStore;
use anyhow::Context as _;
use omabox_contract::{RuntimeResourcePublication, RuntimeResourceScope};
use std::path::Path;

/// A session id: 1–128 characters of `[A-Za-z0-9._-]`.
pub fn check_id(flag: &str, id: &str) -> anyhow::Result<()> {
    let valid = !id.is_empty()
        && id.len() <= 128
        && id
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'_' | b'-'));
    if !valid {
        // Quoted with escapes (a newline or an escape sequence shows as such), and cut: the
        // id may be a megabyte long.
        let shown: String = id.chars().take(64).collect();
        let more = match id.chars().count() {
            n if n > 64 => format!("… ({n} characters)"),
            _ => String::new(),
        };
        anyhow::bail!(
            "{flag} {shown:?}{more} is not valid: use 1–128 characters of A–Z, a–z, 0–9, '.', \
             '_' and '-'"
        );
    }
    Ok(())
}

/// The last publication of `scope`, read off the async workers.
pub async fn publication(
    store: &ChosenStore,
    scope: &RuntimeResourceScope,
) -> anyhow::Result<Option<RuntimeResourcePublication>> {
    store
        .publication(scope)
        .await
        .context("cannot read the session's publication")
}

/// `--workspace DIR` seeds only a new session: DIR must be a directory and the session must
/// have no publication yet.
pub async fn check_seed(
    store: &ChosenStore,
    scope: &RuntimeResourceScope,
    seed: &Path,
) -> anyhow::Result<()> {
    let metadata = std::fs::metadata(seed)
        .with_context(|| format!("--workspace {}: cannot read it", seed.display()))?;
    if !metadata.is_dir() {
        anyhow::bail!("--workspace {} is not a directory", seed.display());
    }
    if let Some(publication) = publication(store, scope).await? {
        anyhow::bail!(
            "session {} already has a published workspace (revision {}); --workspace seeds \
             only a new session. Run without --workspace to continue from revision {}, or \
             choose a new --session",
            scope.session_id,
            publication.revision,
            publication.revision
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_ids_are_checked() {
        assert!(check_id("--session", "s1").is_ok());
        assert!(check_id("--session", "sess_0123.a-b").is_ok());
        for bad in ["", "a/b", "..a b", "é", &"x".repeat(129)] {
            assert!(check_id("--session", bad).is_err(), "{bad:?}");
        }
    }
}
