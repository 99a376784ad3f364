//! Garbage collection of the blob store with a retention policy: what `omabox gc` runs, and
//! what `omabox reap` and `omabox run` can call ([`collect_garbage`]).
//!
//! Kept: every blob the last `keep` published revisions of each work item need (manifests and
//! content; the active revision always, `keep` is at least 1), plus every blob younger than the
//! grace period (in-flight checkpoints and candidates not yet published; see `BlobStore`).
//! A grace shorter than the default protects nothing a run is about to publish, so such a
//! collection runs only while no run holds the collection lock, and holds it exclusively
//! for its whole mark and sweep (`omabox_persistence::collection`); it refuses otherwise.
//! Revisions beyond `keep` are forgotten from the publication history first (so `omabox fsck`
//! and `--from-revision` never offer a revision whose blobs may be gone), then `BlobStore::gc`
//! removes the unreferenced blobs under its exclusive lock. A crash between the two leaves
//! only unreferenced blobs, which the next collection removes.
//!
//! A retained revision whose manifest cannot be read stops the collection (nothing removed):
//! its content is unknown. `dry_run` computes the same figures (count, bytes, per session) and changes nothing.
//!
//! Many hosts (issue 30): with `--database-url` the history read is PostgreSQL's, which every
//! host publishes into, and the blob store is the one `--blob-dir` names, which they share;
//! so a collection on any host keeps what any host's publications name. A blob a host
//! stored but has not published yet is kept by the same two guards as on one machine: by
//! age (the default grace: every put refreshes a reused blob's mtime), or, for a shorter
//! grace, by the run's shared hold of `collect.lock` in the shared directory (flock: the
//! filesystem must honour it across hosts, as NFSv4 on Linux does) and by the store's count
//! of live fences, which counts every host's runs in progress. A history and a blob store
//! that are not shared alike are refused ([`UnsharedCollection`]): a shared blob dir with a
//! host's own SQLite history, or the shared PostgreSQL history with a data dir's own blobs.

use crate::DataDir;
use crate::store_choice::ChosenStore;
use anyhow::Context;
use omabox_contract::RuntimeResourceScope;
use omabox_persistence::{BlobHash, BlobStore, BlobStoreOptions, referenced_blobs};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, SystemTime};

/// Default grace period: unreferenced blobs younger than this stay.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(3600);

/// What to collect.
#[derive(Debug, Clone, Copy)]
pub struct GcOptions {
    /// Published revisions kept per work item (at least 1).
    pub keep: u64,
    /// Unreferenced blobs younger than this stay.
    pub grace: Duration,
    /// Report only; change nothing.
    pub dry_run: bool,
}

/// What a collection did (or, dry, would do).
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GcSummary {
    /// True when nothing was changed.
    pub dry_run: bool,
    /// Revisions kept per work item.
    pub keep: u64,
    /// Published revisions kept in all.
    pub revisions_kept: u64,
    /// Published revisions forgotten (beyond `keep`).
    pub revisions_forgotten: u64,
    /// Blobs in the store before.
    pub blobs_scanned: u64,
    /// Blobs removed (dry: that would be).
    pub blobs_removed: u64,
    /// Their bytes.
    pub bytes_removed: u64,
    /// Unreferenced blobs kept because they are younger than the grace period.
    pub blobs_kept_young: u64,
    /// Per session: forgotten revisions and the blobs only they needed.
    pub sessions: BTreeMap<String, SessionGc>,
    /// Blobs no retained or forgotten revision names (failed runs, abandoned checkpoints).
    pub unreferenced: BlobFigures,
}

/// One session's share of a collection.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionGc {
    /// Revisions forgotten, oldest first.
    pub revisions_forgotten: Vec<u64>,
    /// Blobs removed (dry: that would be) that only those revisions needed.
    pub blobs: u64,
    /// Their bytes.
    pub bytes: u64,
}

/// A count and bytes.
#[derive(Debug, Clone, Copy, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BlobFigures {
    /// Blobs.
    pub blobs: u64,
    /// Bytes.
    pub bytes: u64,
}

/// The refusal to collect a blob store whose history is not the one its writers publish
/// into: a shared `--blob-dir` against one host's SQLite store (other hosts' publications
/// would lose their blobs), or the data dir's own blobs against the shared PostgreSQL
/// history (whose manifests other hosts stored elsewhere: nothing could be marked).
#[derive(Debug, thiserror::Error)]
pub enum UnsharedCollection {
    /// `--blob-dir` without `--database-url`.
    #[error(
        "cannot collect the blob directory {0}: --blob-dir without --database-url, so this \
         host's SQLite store knows only its own publications, and other hosts sharing the \
         directory would lose blobs theirs name (set --database-url / OMABOX_DATABASE_URL to \
         the database the hosts share)"
    )]
    SharedBlobsOwnHistory(String),
    /// `--database-url` without `--blob-dir`.
    #[error(
        "cannot collect {0} against the shared PostgreSQL history: --database-url without \
         --blob-dir, so the hosts' publications name blobs stored in their own data dirs (set \
         --blob-dir / OMABOX_BLOB_DIR to the directory the hosts share)"
    )]
    SharedHistoryOwnBlobs(String),
}

/// Collects the blob store of `data_dir` (`--blob-dir` or `<data-dir>/blobs`) against the
/// history of `store` (see the module doc). Blocks: call it from `spawn_blocking` (on
/// PostgreSQL, of a tokio runtime).
pub fn collect_garbage(
    data_dir: &DataDir,
    store: &ChosenStore,
    options: GcOptions,
) -> anyhow::Result<GcSummary> {
    let keep = options.keep.max(1);
    let root = data_dir.blobs();
    match (store, data_dir.has_own_blob_dir()) {
        (ChosenStore::Sqlite(_), true) => {
            return Err(
                UnsharedCollection::SharedBlobsOwnHistory(root.display().to_string()).into(),
            );
        }
        (ChosenStore::Postgres(_), false) => {
            return Err(
                UnsharedCollection::SharedHistoryOwnBlobs(root.display().to_string()).into(),
            );
        }
        _ => {}
    }
    let blobs = BlobStore::at_with_options(
        &root,
        BlobStoreOptions {
            gc_grace: options.grace,
            fsync: true,
        },
    )
    .with_context(|| format!("cannot open the blob store in {}", root.display()))?;
    // A short grace could remove the blobs a run in progress checkpointed and is about to
    // publish: such a collection holds the collection lock exclusively from before it reads
    // the history until its sweep ended, and every run holds it shared from before its first
    // blob until its publication is committed (`omabox_persistence::collection`). A run that
    // starts meanwhile waits; a run in progress makes this collection refuse. The fence
    // count is a second, older guard (a run of an earlier omabox takes no lock) and words
    // the refusal.
    let _exclusive = if options.grace < DEFAULT_GRACE && !options.dry_run {
        let hold = blobs
            .try_hold_for_collection()
            .context("cannot lock the blob store for a collection")?;
        let active = store
            .active_fence_count_blocking()
            .context("cannot read the fences")?;
        if hold.is_none() || active > 0 {
            let what = match active {
                0 => "a run (or another `omabox gc`) is".to_owned(),
                1 => "1 run is".to_owned(),
                n => format!("{n} runs are"),
            };
            anyhow::bail!(
                "{what} in progress; a grace period shorter than {} s could remove blobs it is \
                 about to publish: wait until it finished (and, after a kill, until `omabox \
                 reap` ran) or leave --grace at its default",
                DEFAULT_GRACE.as_secs()
            );
        }
        hold
    } else {
        None
    };
    let history = store
        .publication_history_blocking()
        .context("cannot read the publication history")?;

    // Newest first per work item: the first `keep` rows of each scope are retained.
    let mut seen: HashMap<RuntimeResourceScope, u64> = HashMap::new();
    let mut referenced: HashSet<BlobHash> = HashSet::new();
    let mut forgotten = Vec::new();
    let mut summary = GcSummary {
        dry_run: options.dry_run,
        keep,
        ..GcSummary::default()
    };
    for (scope, publication) in &history {
        let rank = seen.entry(scope.clone()).or_insert(0);
        *rank += 1;
        if *rank <= keep {
            summary.revisions_kept += 1;
            let unreadable = referenced_blobs(
                &blobs,
                &publication.workspace_candidate,
                publication.output_candidate.as_ref(),
                &mut referenced,
            );
            // Without a retained manifest its content is unknown: removing anything could
            // remove what it needs (and what a repair of the manifest would need).
            if !unreadable.is_empty() {
                anyhow::bail!(
                    "cannot collect: the manifest {} of session {} revision {} cannot be read \
                     (see `omabox fsck --session {}`); nothing was removed. Continue the session \
                     from an intact revision (`omabox run --session {} --from-revision N`) or \
                     retain fewer revisions with --keep",
                    unreadable.join(", "),
                    scope.session_id,
                    publication.revision,
                    scope.session_id,
                    scope.session_id
                );
            }
        } else {
            forgotten.push((scope.clone(), publication));
        }
    }

    // Which session each blob only a forgotten revision needs belongs to (first one wins).
    let mut owner: HashMap<BlobHash, String> = HashMap::new();
    for (scope, publication) in forgotten.iter().rev() {
        let mut needed = HashSet::new();
        let _unknown = referenced_blobs(
            &blobs,
            &publication.workspace_candidate,
            publication.output_candidate.as_ref(),
            &mut needed,
        );
        for hash in needed.difference(&referenced) {
            owner
                .entry(*hash)
                .or_insert_with(|| scope.session_id.clone());
        }
        let session = summary
            .sessions
            .entry(scope.session_id.clone())
            .or_default();
        session.revisions_forgotten.push(publication.revision);
    }
    summary.revisions_forgotten = forgotten.len() as u64;
    crate::pause_point::pause("gc-marked");

    let cutoff = SystemTime::now()
        .checked_sub(options.grace)
        .unwrap_or(SystemTime::UNIX_EPOCH);
    for blob in blobs.scan()? {
        summary.blobs_scanned += 1;
        if referenced.contains(&blob.hash) {
            continue;
        }
        if blob.modified > cutoff {
            summary.blobs_kept_young += 1;
            continue;
        }
        summary.blobs_removed += 1;
        summary.bytes_removed += blob.size;
        let figures = match owner.get(&blob.hash) {
            Some(session) => {
                let session = summary.sessions.entry(session.clone()).or_default();
                (&mut session.blobs, &mut session.bytes)
            }
            None => (
                &mut summary.unreferenced.blobs,
                &mut summary.unreferenced.bytes,
            ),
        };
        *figures.0 += 1;
        *figures.1 += blob.size;
    }
    if options.dry_run {
        return Ok(summary);
    }

    let rows: Vec<(RuntimeResourceScope, u64)> = forgotten
        .iter()
        .map(|(scope, publication)| (scope.clone(), publication.revision))
        .collect();
    store
        .forget_revisions_blocking(&rows)
        .context("cannot forget the revisions beyond the retention")?;
    omabox_sandbox::fault::point("gc-forgotten");
    let report = blobs
        .gc(&referenced)
        .context("cannot garbage-collect the blob store")?;
    // The store's own figures are the truth (a blob may have been refreshed meanwhile).
    summary.blobs_removed = report.removed;
    summary.bytes_removed = report.removed_bytes;
    summary.blobs_kept_young = report.kept_recent;
    Ok(summary)
}
