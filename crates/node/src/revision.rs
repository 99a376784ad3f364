//! Which published revision `omabox run` restores: the session's last one, or with
//! `--from-revision N` an earlier one (continuing a damaged session from an intact revision).
//!
//! The choice is handed to the workspace port before the run starts; the host transaction is
//! unchanged: it claims the fence as always, the port restores the chosen revision's
//! checkpoint, and the run publishes a new revision on top (fence and publish semantics do not
//! change). A revision is only chosen after its workspace checkpoint verified intact (every
//! blob re-hashed), so a damaged one is refused here with what is damaged, not mid-run.

use crate::store_choice::ChosenStore;
use crate::wiring::Persistence;
use anyhow::Context;
use omabox_contract::{RuntimePublicationCandidate, RuntimeResourceScope};
use omabox_persistence::{BlobVerifier, verify_workspace};
use std::sync::Arc;

/// Registers what the run of `scope` restores: revision `from` (checked to exist and be
/// intact), else the last publication (only named, so a failed restore says its revision).
pub async fn choose_restore(
    store: &ChosenStore,
    persistence: &Persistence,
    scope: &RuntimeResourceScope,
    from: Option<u64>,
) -> anyhow::Result<()> {
    let history = store
        .publications_of(scope)
        .await
        .context("cannot read the session's publication history")?;
    let Some(revision) = from else {
        if let Some(last) = history.first() {
            persistence.workspace.name_revision(
                scope.clone(),
                last.revision,
                last.workspace_candidate.clone(),
            );
        }
        return Ok(());
    };
    let Some(chosen) = history.iter().find(|p| p.revision == revision) else {
        if history.is_empty() {
            anyhow::bail!(
                "--from-revision {revision}: session {} has published nothing yet",
                scope.session_id
            );
        }
        let known: Vec<String> = history
            .iter()
            .rev()
            .map(|p| p.revision.to_string())
            .collect();
        anyhow::bail!(
            "--from-revision {revision}: session {} has no revision {revision} (its revisions: {}; \
             `omabox fsck --session {}` shows which are intact)",
            scope.session_id,
            known.join(", "),
            scope.session_id
        );
    };
    check_intact(persistence, scope, revision, &chosen.workspace_candidate).await?;
    persistence.workspace.restore_revision(
        scope.clone(),
        revision,
        chosen.workspace_candidate.clone(),
    );
    Ok(())
}

/// Fails, naming what is damaged, unless `candidate`'s checkpoint is fully present and intact.
async fn check_intact(
    persistence: &Persistence,
    scope: &RuntimeResourceScope,
    revision: u64,
    candidate: &RuntimePublicationCandidate,
) -> anyhow::Result<()> {
    let store = Arc::clone(persistence.workspace.store());
    let candidate = candidate.clone();
    let damages = tokio::task::spawn_blocking(move || {
        verify_workspace(&mut BlobVerifier::new(&store), &candidate)
    })
    .await
    .context("the verification task failed")??;
    if damages.is_empty() {
        return Ok(());
    }
    let listed: Vec<String> = damages
        .iter()
        .take(5)
        .map(|damage| match &damage.path {
            Some(path) => format!("{} ({path}): {}", damage.object, damage.problem),
            None => format!("{}: {}", damage.object, damage.problem),
        })
        .collect();
    anyhow::bail!(
        "--from-revision {revision}: the workspace of session {} at revision {revision} is \
         damaged ({} problem{}: {}); `omabox fsck --session {}` lists the intact revisions",
        scope.session_id,
        damages.len(),
        if damages.len() == 1 { "" } else { "s" },
        listed.join("; "),
        scope.session_id
    )
}
