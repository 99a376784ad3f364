//! The promoted-file store: `<data-dir>/promoted/<id>` (the bytes) and `<id>.json` (size,
//! media type, session, path), where `<id>` is `file_` + 32 random hex digits. Only a file
//! promoted here can be read back, and only by its id: knowing a blob's hash grants nothing.
//!
//! ```text
//!   promote: open .tmp-<pid>-<id> (O_EXCL, 0600), flock it ─► copy in 64 KiB chunks,
//!            hashing ─► hash ≠ expected? remove, fail ─► fsync ─► rename to <id> ─► write
//!            <id>.json (.tmp-<pid>-<id>.json, flocked, + rename): the record's presence is
//!            the promotion's commit point ─► only then close (unlock) the content
//!   read:    id well-formed? ─► <id>.json ─► open <id> (O_NOFOLLOW)
//! ```
//!
//! Memory is constant in the file size both ways (one copy buffer; reads are streamed by the
//! route). A crash leaves at most a `.tmp-*` file or a content file without a record; neither
//! is ever served. [`PromotedStore::remove_abandoned`] (`omabox reap`, every `omabox run`'s
//! start) removes those whose writer's lock is free — never a live promotion's: its writer
//! holds the flock from the temp file's creation until its record is committed; a temp file
//! just created and not yet locked still has a live pid in its name and is young.
//! [`PromotedStore::open`] removes any leftover older than an hour.
//!
//! Must never: follow a symlink in the store, serve a file without its record, accept an id
//! that is not exactly the documented shape, or hold a whole file in memory.

use sha2::{Digest, Sha256};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// What is recorded about a promoted file.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PromotedRecord {
    /// `file_<32 hex>`.
    pub id: String,
    /// Size in bytes.
    pub size: u64,
    /// The media type served with it.
    pub media_type: String,
    /// The session it was promoted from.
    pub session_id: String,
    /// Its sandbox path.
    pub path: String,
}

/// Why the store failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PromotedError {
    /// The bytes read do not hash to what the publication recorded.
    #[error("the stored bytes of {0} do not match their recorded hash")]
    Corrupt(String),
    /// A filesystem operation failed (the text names it, never file content).
    #[error("{what}")]
    Io {
        /// What was being done.
        what: String,
        /// Why it failed.
        #[source]
        source: io::Error,
    },
}

fn io_error(what: impl Into<String>) -> impl FnOnce(io::Error) -> PromotedError {
    let what = what.into();
    move |source| PromotedError::Io { what, source }
}

/// The store (module doc).
#[derive(Debug, Clone)]
pub struct PromotedStore {
    dir: PathBuf,
}

/// Leftovers of interrupted promotions older than this are removed at open.
const STALE_AFTER: Duration = Duration::from_secs(3600);
/// A temp file whose named writer still runs is kept this long even unlocked (the instant
/// between its creation and its lock; a writer in another pid namespace).
pub const WRITER_GRACE: Duration = Duration::from_secs(600);
const ID_PREFIX: &str = "file_";
const ID_HEX_LEN: usize = 32;

impl PromotedStore {
    /// Opens (creating, mode 0700) `<data_dir>/promoted` and removes stale leftovers.
    pub fn open(data_dir: &Path) -> Result<Self, PromotedError> {
        let dir = data_dir.join("promoted");
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(io_error(format!("cannot create {}", dir.display())))?;
        let store = Self { dir };
        store.remove_stale();
        Ok(store)
    }

    /// The store of `data_dir` if it exists, as it is: nothing created, nothing removed (for
    /// `omabox reap`, which calls [`PromotedStore::remove_abandoned`] and reports it).
    pub fn existing(data_dir: &Path) -> Option<Self> {
        let dir = data_dir.join("promoted");
        fs::symlink_metadata(&dir)
            .is_ok_and(|meta| meta.is_dir())
            .then_some(Self { dir })
    }

    fn remove_stale(&self) {
        if let Err(error) = self.remove_abandoned() {
            tracing::warn!(%error, "cannot remove what killed promotions left");
        }
    }

    /// Copies `source` (which must hash to `expected_sha256`) into the store and records it.
    /// Blocking: call from a blocking thread.
    pub fn promote(
        &self,
        mut source: impl Read,
        expected_sha256: &[u8; 32],
        media_type: &str,
        session_id: &str,
        path: &str,
    ) -> Result<PromotedRecord, PromotedError> {
        let id = new_id();
        let temp = self.dir.join(format!(".tmp-{}-{id}", std::process::id()));
        let result = (|| {
            let mut out = create_new(&temp)?;
            let mut hasher = Sha256::new();
            let mut buffer = vec![0_u8; 64 * 1024];
            let mut size = 0_u64;
            loop {
                let read = match source.read(&mut buffer) {
                    Ok(0) => break,
                    Ok(read) => read,
                    Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
                    Err(error) => return Err(io_error(format!("cannot read {path}"))(error)),
                };
                hasher.update(&buffer[..read]);
                out.write_all(&buffer[..read])
                    .map_err(io_error("cannot write a promoted file"))?;
                size += read as u64;
            }
            if hasher.finalize().as_slice() != expected_sha256 {
                return Err(PromotedError::Corrupt(path.to_owned()));
            }
            out.sync_all()
                .map_err(io_error("cannot sync a promoted file"))?;
            omabox_persistence::fault_point("promote-temp-written");
            fs::rename(&temp, self.dir.join(&id))
                .map_err(io_error("cannot commit a promoted file"))?;
            omabox_persistence::fault_point("promote-content-committed");
            Ok((size, out))
        })();
        // `_content` keeps the content's lock until the record is committed (module doc).
        let (size, _content) = match result {
            Ok(done) => done,
            Err(error) => {
                let _ = fs::remove_file(&temp);
                return Err(error);
            }
        };
        let record = PromotedRecord {
            id: id.clone(),
            size,
            media_type: media_type.to_owned(),
            session_id: session_id.to_owned(),
            path: path.to_owned(),
        };
        self.write_record(&record).inspect_err(|_| {
            let _ = fs::remove_file(self.dir.join(&id));
        })?;
        Ok(record)
    }

    fn write_record(&self, record: &PromotedRecord) -> Result<(), PromotedError> {
        let temp = self
            .dir
            .join(format!(".tmp-{}-{}.json", std::process::id(), record.id));
        let write = || {
            let mut out = create_new(&temp)?;
            let json = serde_json::to_vec(record).map_err(|e| PromotedError::Io {
                what: "cannot encode a promoted file's record".to_owned(),
                source: io::Error::other(e),
            })?;
            out.write_all(&json)
                .and_then(|()| out.sync_all())
                .map_err(io_error("cannot write a promoted file's record"))?;
            fs::rename(&temp, self.dir.join(format!("{}.json", record.id)))
                .map_err(io_error("cannot commit a promoted file's record"))
        };
        write().inspect_err(|_| {
            let _ = fs::remove_file(&temp);
        })
    }

    /// Removes what killed promotions left (module doc): `.tmp-*` files and content files
    /// without a record whose writer's flock is free — a temp file also needs its writer's
    /// pid gone or to be older than [`WRITER_GRACE`], for the instant between its creation and
    /// its lock (a legacy temp without a pid: older than an hour). Never waits. Returns how
    /// many files were removed. Blocking.
    pub fn remove_abandoned(&self) -> Result<u64, PromotedError> {
        let entries = fs::read_dir(&self.dir)
            .map_err(io_error(format!("cannot list {}", self.dir.display())))?;
        let mut removed = 0;
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let temp = name.starts_with(".tmp-");
            let unrecorded =
                parse_id(&name).is_some() && !self.dir.join(format!("{name}.json")).exists();
            if !(temp || unrecorded) {
                continue;
            }
            let path = entry.path();
            let Ok(Some(file)) = open_nofollow(&path) else {
                continue;
            };
            if !lock(&file, true).unwrap_or(false) {
                continue; // a live writer holds it
            }
            let abandoned = if temp {
                // A legacy name (no pid: an omabox that took no lock) waits out the hour.
                let pid = temp_writer_pid(&name);
                let grace = if pid.is_some() {
                    WRITER_GRACE
                } else {
                    STALE_AFTER
                };
                let writer_alive =
                    pid.is_none_or(|pid| Path::new(&format!("/proc/{pid}")).exists());
                let young = file
                    .metadata()
                    .and_then(|meta| meta.modified())
                    .ok()
                    .and_then(|modified| modified.elapsed().ok())
                    .is_none_or(|age| age < grace);
                !(writer_alive && young)
            } else {
                // Locked by us now, so its writer is done: recorded meanwhile, or dead.
                !self.dir.join(format!("{name}.json")).exists()
            };
            if abandoned && fs::remove_file(&path).is_ok() {
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// The record and the open bytes of a promoted file; `None` when `id` is malformed or
    /// was never promoted. Blocking.
    /// Where the bytes of `id` are kept (`None` for a string that is no id). Whether the
    /// file exists is for the caller to find out; the file is never changed once stored.
    pub fn content_path(&self, id: &str) -> Option<PathBuf> {
        parse_id(id).map(|()| self.dir.join(id))
    }

    /// Opens `id`'s record and bytes (`None`: no such file).
    pub fn open_file(&self, id: &str) -> Result<Option<(PromotedRecord, File)>, PromotedError> {
        if parse_id(id).is_none() {
            return Ok(None);
        }
        let Some(record_file) = open_nofollow(&self.dir.join(format!("{id}.json")))? else {
            return Ok(None);
        };
        let mut text = Vec::new();
        record_file
            .take(64 * 1024)
            .read_to_end(&mut text)
            .map_err(io_error("cannot read a promoted file's record"))?;
        let record: PromotedRecord =
            serde_json::from_slice(&text).map_err(|e| PromotedError::Io {
                what: format!("the record of {id} is not valid"),
                source: io::Error::other(e),
            })?;
        if record.id != id {
            return Ok(None);
        }
        let Some(file) = open_nofollow(&self.dir.join(id))? else {
            return Ok(None);
        };
        Ok(Some((record, file)))
    }
}

fn new_id() -> String {
    let bytes: [u8; ID_HEX_LEN / 2] = rand::random();
    format!("{ID_PREFIX}{}", hex::encode(bytes))
}

/// `Some(())` when `id` is exactly `file_` + 32 lowercase hex digits.
fn parse_id(id: &str) -> Option<()> {
    let hex = id.strip_prefix(ID_PREFIX)?;
    let valid = hex.len() == ID_HEX_LEN
        && hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    valid.then_some(())
}

/// Creates `path` (`O_EXCL`, 0600) and takes its flock, the sign of a live writer.
fn create_new(path: &Path) -> Result<File, PromotedError> {
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc_o_nofollow())
        .open(path)
        .map_err(io_error(format!("cannot create {}", path.display())))?;
    lock(&file, false).map_err(io_error(format!("cannot lock {}", path.display())))?;
    Ok(file)
}

/// flock `LOCK_EX` (with `try_only`, `LOCK_NB`: `Ok(false)` when another holds it).
fn lock(file: &File, try_only: bool) -> io::Result<bool> {
    if !try_only {
        file.lock()?;
        return Ok(true);
    }
    match file.try_lock() {
        Ok(()) => Ok(true),
        Err(std::fs::TryLockError::WouldBlock) => Ok(false),
        Err(std::fs::TryLockError::Error(error)) => Err(error),
    }
}

/// The writer pid in a temp name `.tmp-<pid>-…` (none in a legacy `.tmp-file_…`).
fn temp_writer_pid(name: &str) -> Option<u32> {
    name.strip_prefix(".tmp-")?.split('-').next()?.parse().ok()
}

fn open_nofollow(path: &Path) -> Result<Option<File>, PromotedError> {
    match OpenOptions::new()
        .read(true)
        .custom_flags(libc_o_nofollow())
        .open(path)
    {
        Ok(file) => Ok(Some(file)),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(error) => Err(io_error(format!("cannot open {}", path.display()))(error)),
    }
}

const fn libc_o_nofollow() -> i32 {
    libc::O_NOFOLLOW
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sha(bytes: &[u8]) -> [u8; 32] {
        Sha256::digest(bytes).into()
    }

    #[test]
    fn promote_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let store = PromotedStore::open(dir.path()).unwrap();
        let record = store
            .promote(
                &b"hello"[..],
                &sha(b"hello"),
                "text/plain",
                "s",
                "/workspace/a.txt",
            )
            .unwrap();
        assert!(parse_id(&record.id).is_some());
        assert_eq!(record.size, 5);
        let (read, mut file) = store.open_file(&record.id).unwrap().unwrap();
        assert_eq!(read, record);
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes).unwrap();
        assert_eq!(bytes, b"hello");
        let mode = fs::metadata(dir.path().join("promoted").join(&record.id))
            .unwrap()
            .permissions();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
            0o600
        );
    }

    #[test]
    fn corrupt_source_is_refused_and_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = PromotedStore::open(dir.path()).unwrap();
        let error = store
            .promote(
                &b"evil"[..],
                &sha(b"good"),
                "text/plain",
                "s",
                "/workspace/a",
            )
            .unwrap_err();
        assert!(matches!(error, PromotedError::Corrupt(_)));
        assert_eq!(
            fs::read_dir(dir.path().join("promoted")).unwrap().count(),
            0
        );
    }

    /// A pid no process has any more.
    fn dead_pid() -> u32 {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        pid
    }

    #[test]
    fn only_what_no_live_writer_holds_is_removed_as_abandoned() {
        let dir = tempfile::tempdir().unwrap();
        let store = PromotedStore::open(dir.path()).unwrap();
        let root = dir.path().join("promoted");
        let recorded = store
            .promote(
                &b"kept"[..],
                &sha(b"kept"),
                "text/plain",
                "s",
                "/workspace/k",
            )
            .unwrap();
        let id = |n: char| format!("file_{}", n.to_string().repeat(32));
        // A live promotion: its temp and its unrecorded content, both locked by their writer.
        let live_temp = create_new(&root.join(format!(".tmp-{}-{}", dead_pid(), id('a')))).unwrap();
        let live_content = create_new(&root.join(id('b'))).unwrap();
        // A temp just created by a live process, not locked yet.
        fs::write(
            root.join(format!(".tmp-{}-{}", std::process::id(), id('c'))),
            b"x",
        )
        .unwrap();
        // What killed writers left: unlocked.
        fs::write(root.join(format!(".tmp-{}-{}", dead_pid(), id('d'))), b"x").unwrap();
        fs::write(
            root.join(format!(".tmp-{}-{}.json", dead_pid(), id('e'))),
            b"{",
        )
        .unwrap();
        fs::write(root.join(id('f')), b"x").unwrap();

        assert_eq!(store.remove_abandoned().unwrap(), 3);
        let mut left: Vec<String> = fs::read_dir(&root)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        let mut expected = vec![
            recorded.id.clone(),
            format!("{}.json", recorded.id),
            id('b'),
            format!(".tmp-{}-{}", std::process::id(), id('c')),
        ];
        expected.sort();
        assert_eq!(left.len(), 5, "{left:?}");
        for name in &expected {
            assert!(left.contains(name), "{name} removed: {left:?}");
        }
        assert!(store.open_file(&recorded.id).unwrap().is_some());
        // Its writer gone, the live promotion's leftovers go too.
        drop((live_temp, live_content));
        assert_eq!(store.remove_abandoned().unwrap(), 2);
    }

    #[test]
    fn only_well_formed_recorded_ids_are_served() {
        let dir = tempfile::tempdir().unwrap();
        let store = PromotedStore::open(dir.path()).unwrap();
        let unrecorded = format!("file_{}", "a".repeat(32));
        fs::write(dir.path().join("promoted").join(&unrecorded), b"x").unwrap();
        for id in [
            unrecorded.as_str(),
            "file_../../x",
            &format!("file_{}", "A".repeat(32)),
            &format!("file_{}", "a".repeat(64)),
            "",
        ] {
            assert!(store.open_file(id).unwrap().is_none(), "{id}");
        }
    }
}
