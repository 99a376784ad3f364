//! What a crashed host (kill -9, power loss, a second Ctrl-C) leaves behind, found without
//! any record the crashed process would have had to write on its way out:
//!
//! - **sandboxes** under the linux runtime dir whose owner process is gone and that no
//!   journaled lease names (those are the abandoned-lease reaper's, which bills them): one
//!   killed half-way through its start, or before its lease was journaled
//!   (`omabox_backend_linux::leftovers`);
//! - **binding directories** `<data-dir>/runtime/<scope>/<generation>/wsb_…` and
//!   `<data-dir>/runtime-outputs/<scope>/<generation>/outb_…` of a generation that no longer
//!   holds its work item's fence (an older generation, or the latest one released or
//!   expired): it can never publish again, so its `/workspace` and outputs are garbage. The
//!   directories are listed *before* the fences are read, so a run that claims its fence and
//!   makes its binding meanwhile is seen holding it;
//! - **temp blobs** `<data-dir>/blobs/tmp/put-…` of puts that cannot finish
//!   (`BlobStore::remove_abandoned_temps`);
//! - **image cache temps** `<image-cache>/tmp/…` of killed pulls and unpacks, whose lock
//!   nobody holds any more (`ImageCache::sweep_temps`).
//! - **memory-store stages** `<data-dir>/memory/.pending/<run>/` of dead runs (their lock is
//!   free): committed when the run's generation published, else discarded
//!   (`session_inputs::recover_memory_stages`), so memory stores and workspace move together;
//! - **promotions** into the file store (`<data-dir>/promoted/`) killed half-way: temp files
//!   and content without a record whose writer's lock is free
//!   (`PromotedStore::remove_abandoned`);
//! - **paused serve sandboxes' files** `<data-dir>/paused-sandboxes/<pid>-<start time>/` of a
//!   serve that is gone (`sandboxes::saved::remove_dead_serves`): their records died with it.
//!
//! `omabox reap` runs [`sweep`] after its lease passes; `omabox run` runs [`before_run`]
//! (abandoned leases, then the sweep) before it claims anything: a few directory listings and
//! one query when there is nothing to do. This module must never remove anything of a
//! generation that holds its fence or of a sandbox whose owner is alive, follow a symlink, or
//! fail a run because a leftover could not be removed.

use crate::store_choice::ChosenStore;
use crate::wiring;
use crate::{DataDir, NodeConfig};
use omabox_backend_linux::factory::LinuxSandboxFactory;
use omabox_backend_linux::leftovers::{LeftoverSweep, reap_leftovers};
use omabox_backend_linux::managed::LINUX_PROVIDER;
use omabox_contract::RuntimeLeaseJournalPort;
use omabox_host::lease_journal::AbandonedLeaseReaper;
use omabox_persistence::{BlobHash, BlobStore};
use serde::Serialize;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The error text of a runtime dir this user may not list.
const PERMISSION_DENIED_RUNTIME_DIR: &str = "no permission to list the sandboxes in";

/// Abandoned leases reaped per `omabox run` start (the rest wait for the next run or reap).
const LEASES_PER_RUN: u64 = 16;

/// What one sweep found and removed.
#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LeftoverReport {
    /// Linux sandboxes under the runtime dir.
    pub sandboxes: LeftoverSweep,
    /// Binding directories removed, relative to the data dir.
    pub bindings_removed: Vec<String>,
    /// Binding directories of generations that hold their fence (kept).
    pub bindings_live: usize,
    /// Abandoned temp blobs removed.
    pub temp_blobs_removed: u64,
    /// Temporary workspaces of killed `omabox sandbox run`s (in `$TMPDIR`) removed.
    pub temp_workspaces_removed: Vec<String>,
    /// Temporary entries of killed image pulls and unpacks removed.
    pub image_temps_removed: Vec<String>,
    /// Memory-store write-backs of dead runs: committed (their run published) or discarded.
    pub memory_stages: crate::session_inputs::MemoryRecovery,
    /// Temp and unrecorded files of killed promotions into the file store removed.
    pub promoted_removed: u64,
    /// Saved files of the paused sandboxes of serves that are gone, removed.
    pub paused_sandboxes_removed: Vec<String>,
    /// Containers of dead hosts removed from the Docker Engine ([`sweep_docker`]), by
    /// sandbox id.
    pub docker_containers_removed: Vec<String>,
    /// Gvisor sandboxes of dead omabox processes removed (runsc state and directory), by
    /// id.
    pub gvisor_sandboxes_removed: Vec<String>,
    /// What could not be looked at or removed.
    pub errors: Vec<String>,
}

/// Finds and removes every leftover of a dead host (module doc). Never fails: what could not
/// be done is in the report's `errors`.
/// Where it looks: `data_dir`, and from `config` the linux runtime dir, the tmp dir
/// (temporary workspaces) and the image cache.
pub async fn sweep(config: &NodeConfig, data_dir: &DataDir, store: &ChosenStore) -> LeftoverReport {
    let (config, data_dir, store) = (config.clone(), data_dir.clone(), store.clone());
    tokio::task::spawn_blocking(move || sweep_blocking(&config, &data_dir, &store))
        .await
        .unwrap_or_else(|error| LeftoverReport {
            errors: vec![format!("the leftover sweep failed: {error}")],
            ..LeftoverReport::default()
        })
}

/// `omabox reap`'s pass over the Docker Engine at `DOCKER_HOST` (else the default socket,
/// when it exists): removes the containers labelled by a host of this machine that is gone
/// (`omabox_backend_docker::reap`), never another machine's. No engine there is nothing to
/// sweep; an engine `DOCKER_HOST` names that does not answer is an error in the report.
/// Not part of [`sweep`], so `omabox run` does not reach for an engine at every start.
pub async fn sweep_docker(report: &mut LeftoverReport) {
    use omabox_backend_docker::{Engine, host::host_is_gone, reap::reap_dead_hosts};
    let given = std::env::var_os("DOCKER_HOST").is_some_and(|host| !host.is_empty());
    if !given && !Path::new("/var/run/docker.sock").exists() {
        return;
    }
    let engine = match Engine::from_env().await {
        Ok(engine) => engine,
        Err(error) => {
            if given {
                report.errors.push(format!(
                    "docker: {}",
                    omabox_backend_docker::describe(&error)
                ));
            }
            return;
        }
    };
    match reap_dead_hosts(&engine, |host| !host_is_gone(host)).await {
        Ok(reaped) => {
            report.docker_containers_removed = reaped.into_iter().map(|r| r.sandbox).collect();
        }
        Err(error) => report.errors.push(format!(
            "docker: {}",
            omabox_backend_docker::describe(&error)
        )),
    }
}

/// `omabox run`'s start: reaps a few abandoned leases, then [`sweep`]s. Problems come back as
/// one warning line (for the caller to show) and never stop the run.
pub async fn before_run(
    config: &NodeConfig,
    data_dir: &DataDir,
    store: &ChosenStore,
) -> Option<String> {
    let resolver = wiring::sandbox_resolver(&config.factory_env(), store.usage());
    let journal: Arc<dyn RuntimeLeaseJournalPort> = store.journal();
    let mut errors = match AbandonedLeaseReaper::new(journal, resolver)
        .with_session_tokens(store.tokens())
        .run_once(LEASES_PER_RUN)
        .await
    {
        Ok(summary) => summary
            .errors
            .into_iter()
            .map(|failure| format!("lease {}: {}", failure.runtime_id, failure.error))
            .collect(),
        Err(error) => vec![format!("abandoned leases: {error}")],
    };
    let report = sweep(config, data_dir, store).await;
    // A runtime dir this user may not read (root's /run/omabox under a non-root run) holds
    // nothing this run could clean up; `omabox reap` still reports it.
    errors.extend(
        report
            .errors
            .into_iter()
            .filter(|error| !error.contains(PERMISSION_DENIED_RUNTIME_DIR)),
    );
    (!errors.is_empty()).then(|| {
        format!(
            "omabox: warning: leftovers of earlier runs could not all be removed ({}); see `omabox reap`",
            errors.join("; ")
        )
    })
}

fn sweep_blocking(config: &NodeConfig, data_dir: &DataDir, store: &ChosenStore) -> LeftoverReport {
    let mut report = LeftoverReport::default();
    // Sandboxes a journaled lease names are the lease reaper's: it bills them too.
    let journaled: HashSet<String> = match store.journaled_runtime_ids_blocking(LINUX_PROVIDER) {
        Ok(ids) => ids,
        Err(error) => {
            report.errors.push(format!("lease journal: {error}"));
            return report;
        }
    };
    match linux_runtime_config(config) {
        Ok(config) => match reap_leftovers(&config, &|id| journaled.contains(id)) {
            Ok(sandboxes) => report.sandboxes = sandboxes,
            Err(error) if error.kind() == std::io::ErrorKind::PermissionDenied => {
                report.errors.push(format!(
                    "{PERMISSION_DENIED_RUNTIME_DIR} {}",
                    config.runtime_dir.display()
                ));
            }
            Err(error) => report.errors.push(format!(
                "cannot list the sandboxes in {}: {error}",
                config.runtime_dir.display()
            )),
        },
        Err(error) => report.errors.push(error),
    }
    sweep_bindings(data_dir, store, &mut report);
    report.memory_stages = crate::session_inputs::recover_memory_stages(data_dir, &|claim| {
        crate::session_inputs::generation_published(store, claim)
    });
    if let Some(promoted) = omabox_proxy::promoted::PromotedStore::existing(&data_dir.files_home())
    {
        match promoted.remove_abandoned() {
            Ok(removed) => report.promoted_removed = removed,
            Err(error) => report.errors.push(format!("file store: {error}")),
        }
    }
    // `omabox sandbox run --backend gvisor` keeps its sandboxes under the data dir.
    if let Some(runsc) = omabox_backend_gvisor::locate_runsc() {
        let reaped =
            omabox_backend_gvisor::reap::reap_orphans(&runsc, &data_dir.root().join("gvisor"));
        report.gvisor_sandboxes_removed = reaped.removed;
        report
            .errors
            .extend(reaped.errors.into_iter().map(|e| format!("gvisor: {e}")));
    }
    let (paused, errors) = crate::sandboxes::saved::remove_dead_serves(data_dir.root(), None);
    report.paused_sandboxes_removed = paused.iter().map(|p| p.display().to_string()).collect();
    report
        .errors
        .extend(errors.into_iter().map(|e| format!("paused sandboxes: {e}")));
    // Their sandboxes went above; what they wrote into /workspace goes now.
    let (workspaces, errors) = crate::temp_workspace::sweep_abandoned(&config.tmp_dir());
    report.temp_workspaces_removed = workspaces.iter().map(|p| p.display().to_string()).collect();
    report.errors.extend(
        errors
            .into_iter()
            .map(|e| format!("temporary workspace {e}")),
    );
    // Environment layer builds a crashed host left (their sandboxes went above).
    match config.image_cache() {
        Ok(image_cache) => {
            omabox_backend_linux::env_layer::EnvLayers::in_image_cache(&image_cache)
                .sweep_partials();
            match omabox_backend_linux::ImageCache::new(&image_cache).sweep_temps() {
                Ok(removed) => {
                    report.image_temps_removed =
                        removed.iter().map(|p| p.display().to_string()).collect();
                }
                Err(error) => report.errors.push(format!("image cache temps: {error}")),
            }
        }
        Err(error) => report.errors.push(format!("image cache: {error}")),
    }
    if data_dir.blobs().is_dir() {
        match BlobStore::at(&data_dir.blobs()).map(|blobs| blobs.remove_abandoned_temps()) {
            Ok(Ok(removed)) => report.temp_blobs_removed = removed,
            Ok(Err(error)) | Err(error) => report.errors.push(format!("temp blobs: {error}")),
        }
    }
    report
}

/// The linux runtime settings (runtime dir, cgroup parent) the node's settings select.
pub fn linux_runtime_config(
    config: &NodeConfig,
) -> Result<omabox_backend_linux::RuntimeConfig, String> {
    config
        .linux_config(&LinuxSandboxFactory::new())
        .map(|linux| linux.runtime)
        .map_err(|error| format!("linux runtime settings: {error}"))
}

/// One binding directory found on disk.
struct Binding {
    /// Relative to the data dir.
    relative: String,
    path: PathBuf,
    scope_dir: String,
    generation: u64,
}

fn is_hex(text: &str, len: usize) -> bool {
    text.len() == len
        && text
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The real (non-symlink) subdirectories of `dir` whose names `keep` accepts.
fn subdirs(dir: &Path, keep: impl Fn(&str) -> bool) -> Vec<(String, PathBuf)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().to_str()?.to_owned();
            let is_dir = entry.file_type().ok()?.is_dir();
            (is_dir && keep(&name)).then(|| (name, entry.path()))
        })
        .collect()
}

fn list_bindings(data_dir: &DataDir) -> Vec<Binding> {
    let mut found = Vec::new();
    for (area_dir, prefix) in data_dir.binding_areas() {
        let area = area_dir
            .file_name()
            .map(|name| name.to_string_lossy().into_owned())
            .unwrap_or_default();
        for (scope_dir, scope_path) in subdirs(&area_dir, |name| is_hex(name, 64)) {
            let generations = subdirs(&scope_path, |name| {
                !name.is_empty() && name.len() <= 20 && name.bytes().all(|b| b.is_ascii_digit())
            });
            for (generation_name, generation_path) in generations {
                let Ok(generation) = generation_name.parse::<u64>() else {
                    continue;
                };
                let bindings = subdirs(&generation_path, |name| {
                    name.strip_prefix(prefix).is_some_and(|hex| is_hex(hex, 32))
                });
                for (binding, path) in bindings {
                    found.push(Binding {
                        relative: format!("{area}/{scope_dir}/{generation}/{binding}"),
                        path,
                        scope_dir: scope_dir.clone(),
                        generation,
                    });
                }
            }
        }
    }
    found
}

fn sweep_bindings(data_dir: &DataDir, store: &ChosenStore, report: &mut LeftoverReport) {
    // Listed first, fences read second (module doc).
    let bindings = list_bindings(data_dir);
    if bindings.is_empty() {
        return;
    }
    let claims: HashMap<String, (u64, bool)> = match store.work_item_claims_blocking() {
        Ok(claims) => claims
            .into_iter()
            .map(|claim| {
                let scope_dir = BlobHash::of(claim.scope.key().as_bytes()).to_hex();
                (scope_dir, (claim.generation, claim.held))
            })
            .collect(),
        Err(error) => {
            report.errors.push(format!("binding dirs: {error}"));
            return;
        }
    };
    for binding in bindings {
        let dead = match claims.get(&binding.scope_dir) {
            Some(&(latest, held)) => {
                binding.generation < latest || (binding.generation == latest && !held)
            }
            // Every binding is made after its fence was claimed, so a work item unknown to
            // this store's fence table has no run that could use it.
            None => true,
        };
        if !dead {
            report.bindings_live += 1;
            continue;
        }
        match remove_tree(&binding.path) {
            Ok(()) => {
                omabox_persistence::prune_empty_parents(&binding.path);
                report.bindings_removed.push(binding.relative);
            }
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => report
                .errors
                .push(format!("cannot remove {}: {error}", binding.relative)),
        }
    }
}

/// Removes the directory tree at `root`, which a sandbox filled (hostile: any depth, any
/// width, symlinks anywhere). Never recursive, so neither the stack nor the open file
/// descriptors grow with the tree's depth (a chain of any depth is as easy as a flat dir; the
/// std `remove_dir_all` holds one fd and one stack frame per level): each pass deletes every
/// non-directory and empty directory at the top level and moves the children of every
/// non-empty top-level directory up to the top level (a rename on one filesystem), so every
/// path this touches is at most two levels below `root`. Symlinks are removed, never followed.
fn remove_tree(root: &Path) -> std::io::Result<()> {
    let mut hoisted: u64 = 0;
    loop {
        let mut deeper = false;
        for entry in std::fs::read_dir(root)? {
            let entry = entry?;
            let path = entry.path();
            if !entry.file_type()?.is_dir() {
                remove_if_present(std::fs::remove_file(&path))?;
                continue;
            }
            match std::fs::remove_dir(&path) {
                Ok(()) => continue,
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => continue,
                Err(error) if error.kind() != std::io::ErrorKind::DirectoryNotEmpty => {
                    return Err(error);
                }
                Err(_) => {}
            }
            deeper = true;
            for child in std::fs::read_dir(&path)? {
                let child = child?.path();
                // A fresh name at the top level; `rename` replaces a file or empty dir that
                // happens to have it (we delete everything anyway) and fails on a non-empty one.
                loop {
                    hoisted += 1;
                    let target = root.join(format!(".omabox-removing-{hoisted}"));
                    match std::fs::rename(&child, &target) {
                        Ok(()) => break,
                        Err(error) if error.kind() == std::io::ErrorKind::DirectoryNotEmpty => {}
                        Err(error) => return Err(error),
                    }
                }
            }
        }
        if !deeper {
            return std::fs::remove_dir(root);
        }
    }
}

fn remove_if_present(result: std::io::Result<()>) -> std::io::Result<()> {
    match result {
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use omabox_contract::{
        AcquireRuntimeFenceInput, RuntimeResourceFencePort, RuntimeResourceScope, TerminationReason,
    };
    use omabox_store::SqliteStore;

    fn binding(data: &Path, area: &str, scope: &RuntimeResourceScope, generation: u64) -> PathBuf {
        let prefix = if area == "runtime" { "wsb_" } else { "outb_" };
        let dir = data
            .join(area)
            .join(BlobHash::of(scope.key().as_bytes()).to_hex())
            .join(generation.to_string())
            .join(format!("{prefix}{}", "0".repeat(32)));
        std::fs::create_dir_all(dir.join("workspace/deep")).unwrap();
        std::fs::write(dir.join("workspace/deep/file"), b"x").unwrap();
        dir
    }

    async fn claim(
        store: &SqliteStore,
        scope: &RuntimeResourceScope,
    ) -> omabox_contract::RuntimeResourceFence {
        match store
            .acquire(AcquireRuntimeFenceInput {
                scope: scope.clone(),
                owner_id: "host".into(),
                ttl_ms: 60_000,
            })
            .await
            .unwrap()
        {
            omabox_contract::AcquireRuntimeFenceResult::Acquired { fence, .. } => fence,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_deep_and_hostile_tree_is_removed_without_recursion() {
        let base = tempfile::tempdir().unwrap();
        let root = base.path().join("tree");
        std::fs::create_dir(&root).unwrap();
        // A 3 000-deep chain (deeper than PATH_MAX allows to name), built bottom-up with
        // short paths only.
        let mut chain = root.join("link0");
        std::fs::create_dir(&chain).unwrap();
        std::fs::write(chain.join("leaf"), b"x").unwrap();
        for depth in 1..3_000 {
            let next = root.join(format!("link{depth}"));
            std::fs::create_dir(&next).unwrap();
            std::fs::rename(&chain, next.join("d")).unwrap();
            chain = next;
        }
        // Wide, with names that collide with the hoisting names, and symlinks out.
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("keep"), b"keep").unwrap();
        std::os::unix::fs::symlink(outside.path(), root.join("escape")).unwrap();
        let wide = root.join("wide");
        std::fs::create_dir(&wide).unwrap();
        for i in 0..200 {
            let dir = wide.join(format!(".omabox-removing-{i}"));
            std::fs::create_dir(&dir).unwrap();
            std::fs::write(dir.join("f"), b"x").unwrap();
            std::os::unix::fs::symlink(outside.path(), dir.join("out")).unwrap();
        }
        std::fs::create_dir(root.join(".omabox-removing-3")).unwrap();
        std::fs::write(root.join(".omabox-removing-3/f"), b"x").unwrap();

        remove_tree(&root).unwrap();
        assert!(!root.exists());
        assert!(
            outside.path().join("keep").exists(),
            "a symlink was followed"
        );
    }

    #[tokio::test]
    async fn only_bindings_of_generations_that_hold_their_fence_survive() {
        let data = tempfile::tempdir().unwrap();
        let store = SqliteStore::open_in_memory().unwrap();
        let live = RuntimeResourceScope::new("local", "default", "live", "main");
        let done = RuntimeResourceScope::new("local", "default", "done", "main");
        let unknown = RuntimeResourceScope::new("local", "default", "unknown", "main");

        let first = claim(&store, &live).await;
        store
            .release(&first, TerminationReason::LeaseLost)
            .await
            .unwrap();
        let _second = claim(&store, &live).await; // generation 2 holds the fence
        let older = binding(data.path(), "runtime", &live, 1);
        let current_ws = binding(data.path(), "runtime", &live, 2);
        let current_out = binding(data.path(), "runtime-outputs", &live, 2);
        let fence = claim(&store, &done).await;
        store
            .release(&fence, TerminationReason::Completed)
            .await
            .unwrap();
        let released = binding(data.path(), "runtime", &done, 1);
        let stray = binding(data.path(), "runtime-outputs", &unknown, 7);
        // A symlink where a binding would be is not a binding.
        let link_parent = data
            .path()
            .join("runtime")
            .join(BlobHash::of(done.key().as_bytes()).to_hex())
            .join("3");
        std::fs::create_dir_all(&link_parent).unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(
            outside.path(),
            link_parent.join(format!("wsb_{}", "1".repeat(32))),
        )
        .unwrap();

        let mut report = LeftoverReport::default();
        sweep_bindings(
            &DataDir::at(data.path()),
            &ChosenStore::Sqlite(store.clone()),
            &mut report,
        );
        assert!(report.errors.is_empty(), "{:?}", report.errors);
        assert_eq!(report.bindings_live, 2);
        assert_eq!(
            report.bindings_removed.len(),
            3,
            "{:?}",
            report.bindings_removed
        );
        assert!(current_ws.join("workspace/deep/file").exists());
        assert!(current_out.exists());
        for gone in [&older, &released, &stray] {
            assert!(!gone.exists(), "{}", gone.display());
            assert!(
                !gone.parent().unwrap().exists(),
                "empty generation dir pruned"
            );
        }
        assert!(outside.path().exists());
    }
}
