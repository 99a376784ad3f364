//! The files of paused serve sandboxes (E2B's filesystem pause): each saved directory
//! (`/home/user` when it exists, `/workspace`, `/tmp`) as the tar stream the sandbox's agent
//! sends, in `<data dir>/paused-sandboxes/<serve pid>-<its start time>/<sandbox id>/`
//! (directories 0700, files 0600), at most [`MAX_SAVED_BYTES`] per sandbox; sent back to a
//! new sandbox's agent on resume, which extracts it inside (refusing entries that leave the
//! directory). The host never extracts, lists or follows anything in an archive.
//!
//! A serve that ends removes its own directory; one that died (its owner pid gone or
//! reused) is removed by the next serve on the same data dir and by `omabox reap` (and the
//! leftover sweep of `omabox run`), see [`remove_dead_serves`].
//!
//! Must never: build a path from a caller's text (the sandbox ids used here are serve's
//! own, from its map); write beyond the cap; leave a partial save behind a failed pause.

use omabox_agent::AgentClient;
use std::io;
use std::os::unix::fs::DirBuilderExt as _;
use std::path::{Path, PathBuf};
use tokio::io::AsyncWriteExt as _;

/// Bytes one paused sandbox's saved files take at most (all directories together).
pub const MAX_SAVED_BYTES: u64 = 512 << 20;
/// The directories a pause keeps, in the sandbox, and the file each is saved in.
pub const SAVED_DIRS: &[(&str, &str)] = &[
    ("/home/user", "home-user.tar"),
    ("/workspace", "workspace.tar"),
    ("/tmp", "tmp.tar"),
];
/// The directory below the data dir.
pub const PAUSED_DIR: &str = "paused-sandboxes";
/// How long a save or a restore may take in all (a sandbox that stalls its agent's tar
/// stream fails its own pause or resume, and holds no request longer).
pub const TRANSFER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(300);

/// Why saving or restoring failed (the text names the directory, never file contents).
#[derive(Debug, thiserror::Error)]
pub enum SavedError {
    /// Longer than [`TRANSFER_TIMEOUT`].
    #[error("moving the sandbox's files took longer than {} s", TRANSFER_TIMEOUT.as_secs())]
    TimedOut,
    /// Over [`MAX_SAVED_BYTES`].
    #[error("the sandbox's files are larger than {MAX_SAVED_BYTES} bytes: it cannot be paused")]
    TooLarge,
    /// The agent refused or failed.
    #[error("{what} {dir} in the sandbox: {source}")]
    Agent {
        /// What was done.
        what: &'static str,
        /// Which directory.
        dir: &'static str,
        /// Why.
        #[source]
        source: omabox_agent::ClientError,
    },
    /// A host file operation failed.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was done.
        what: &'static str,
        /// Where.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
}

fn io_error(what: &'static str, path: &Path) -> impl FnOnce(io::Error) -> SavedError + use<> {
    let path = path.to_owned();
    move |source| SavedError::Io { what, path, source }
}

/// This serve's directory of saved sandboxes (not created yet).
#[derive(Debug, Clone)]
pub struct SavedFiles {
    dir: PathBuf,
}

impl SavedFiles {
    /// The directory of this process below `data_root`; the directories of serves that
    /// are gone are removed (best effort, logged).
    pub fn of_this_process(data_root: &Path) -> Self {
        let pid = std::process::id();
        let owner = format!("{pid}-{}", start_time(pid).unwrap_or(0));
        let (removed, errors) = remove_dead_serves(data_root, Some(&owner));
        for dir in removed {
            tracing::info!(dir = %dir.display(), "removed the paused sandboxes of a serve that is gone");
        }
        for error in errors {
            tracing::warn!(%error, "cannot remove the paused sandboxes of a serve that is gone");
        }
        Self {
            dir: data_root.join(PAUSED_DIR).join(owner),
        }
    }

    /// Where sandbox `id`'s files are kept.
    pub fn of(&self, id: &str) -> PathBuf {
        self.dir.join(id)
    }

    /// Saves the directories of the sandbox behind `client` as `id`'s; on error nothing
    /// of it is left.
    pub async fn save(&self, id: &str, client: &AgentClient) -> Result<(), SavedError> {
        let target = self.of(id);
        let result = tokio::time::timeout(TRANSFER_TIMEOUT, self.save_into(&target, client))
            .await
            .unwrap_or(Err(SavedError::TimedOut));
        if result.is_err() {
            let _ = std::fs::remove_dir_all(&target);
        }
        result
    }

    async fn save_into(&self, target: &Path, client: &AgentClient) -> Result<(), SavedError> {
        std::fs::DirBuilder::new()
            .mode(0o700)
            .recursive(true)
            .create(&self.dir)
            .map_err(io_error("creating", &self.dir))?;
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(target)
            .map_err(io_error("creating", target))?;
        let mut total = 0u64;
        for (dir, file) in SAVED_DIRS {
            let agent = |what| move |source| SavedError::Agent { what, dir, source };
            if !client.exists(dir).await.map_err(agent("looking for"))? {
                continue;
            }
            let path = target.join(file);
            let mut out = tokio::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)
                .await
                .map_err(io_error("creating", &path))?;
            let mut reader = client.tar_out(dir).map_err(agent("archiving"))?;
            while let Some(chunk) = reader.chunk().await.map_err(agent("archiving"))? {
                total += chunk.len() as u64;
                if total > MAX_SAVED_BYTES {
                    return Err(SavedError::TooLarge);
                }
                out.write_all(&chunk)
                    .await
                    .map_err(io_error("writing", &path))?;
            }
            out.sync_all().await.map_err(io_error("writing", &path))?;
        }
        Ok(())
    }

    /// Sends `id`'s saved directories to the sandbox behind `client`, which extracts them.
    pub async fn restore(&self, id: &str, client: &AgentClient) -> Result<(), SavedError> {
        tokio::time::timeout(TRANSFER_TIMEOUT, self.restore_from(id, client))
            .await
            .unwrap_or(Err(SavedError::TimedOut))
    }

    async fn restore_from(&self, id: &str, client: &AgentClient) -> Result<(), SavedError> {
        let source = self.of(id);
        for (dir, file) in SAVED_DIRS {
            let path = source.join(file);
            let mut archive = match tokio::fs::File::open(&path).await {
                Ok(archive) => archive,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(io_error("opening", &path)(e)),
            };
            client
                .tar_in(dir, &mut archive)
                .await
                .map_err(|source| SavedError::Agent {
                    what: "restoring",
                    dir,
                    source,
                })?;
        }
        Ok(())
    }

    /// Removes `id`'s saved files (none: fine).
    pub fn remove(&self, id: &str) {
        remove_logged(&self.of(id));
    }

    /// Removes this serve's directory (serve is stopping: its paused sandboxes end).
    pub fn remove_all(&self) {
        remove_logged(&self.dir);
    }
}

fn remove_logged(path: &Path) {
    match std::fs::remove_dir_all(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(error) => {
            tracing::warn!(path = %path.display(), %error, "cannot remove a paused sandbox's files");
        }
    }
}

/// Removes the saved files of every serve below `data_root` that is gone (all but `keep`'s
/// and those of live serves): the directories removed, and what could not be.
pub fn remove_dead_serves(data_root: &Path, keep: Option<&str>) -> (Vec<PathBuf>, Vec<String>) {
    let parent = data_root.join(PAUSED_DIR);
    let (mut removed, mut errors) = (Vec::new(), Vec::new());
    let entries = match std::fs::read_dir(&parent) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return (removed, errors),
        Err(e) => {
            errors.push(format!("listing {}: {e}", parent.display()));
            return (removed, errors);
        }
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if keep == Some(&*name) || owner_alive(&name) {
            continue;
        }
        let path = entry.path();
        // Neither removal follows a symlink: a link here is removed, not its target.
        let result = if entry.file_type().is_ok_and(|t| t.is_dir()) {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
        match result {
            Ok(()) => removed.push(path),
            Err(e) => errors.push(format!("removing {}: {e}", path.display())),
        }
    }
    (removed, errors)
}

/// Whether the serve that named a directory `<pid>-<start time>` still runs.
fn owner_alive(name: &str) -> bool {
    let Some((pid, start)) = name.split_once('-') else {
        return false;
    };
    match (pid.parse::<u32>(), start.parse::<u64>()) {
        (Ok(pid), Ok(start)) => start_time(pid) == Some(start),
        _ => false,
    }
}

/// Process `pid`'s start time in clock ticks since boot (`/proc/<pid>/stat` field 22).
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: fields are counted after the last
    // `)`, where field 3 is the first and field 22 the 20th.
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(19)?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_files_of_a_serve_that_is_gone_are_removed_and_a_live_ones_kept() {
        let root = tempfile::tempdir().unwrap();
        let parent = root.path().join(PAUSED_DIR);
        // pid 1 runs, with another start time than this: a serve that is gone.
        let gone = parent.join(format!("1-{}", u64::MAX)).join("sandboxid");
        let unnamed = parent.join("junk");
        std::fs::create_dir_all(&gone).unwrap();
        std::fs::create_dir_all(&unnamed).unwrap();
        // Another live process (this test's parent) as the owner: kept.
        let ppid = std::os::unix::process::parent_id();
        let live = parent.join(format!("{ppid}-{}", start_time(ppid).unwrap()));
        std::fs::create_dir_all(&live).unwrap();
        let saved = SavedFiles::of_this_process(root.path());
        assert!(!gone.parent().unwrap().exists());
        assert!(!unnamed.exists());
        assert!(live.exists());
        assert!(saved.of("x").starts_with(&parent));
        assert!(owner_alive(live.file_name().unwrap().to_str().unwrap()));
    }
}
