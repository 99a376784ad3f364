//! The promoted-file store: `<data-dir>/promoted/<id>` (the bytes) and `<id>.json` (size,
//! media type, session, path), where `<id>` is `file_` + 32 random hex digits. Only a file
//! promoted here can be read back, and only by its id: knowing a blob's hash grants nothing.
//!
//! ```text
//!   promote: open .tmp-<id> (O_EXCL, 0600) ─► copy in 64 KiB chunks, hashing ─► hash ≠
//!            expected? remove, fail ─► fsync ─► rename to <id> ─► write <id>.json (tmp +
//!            rename): the record's presence is the promotion's commit point
//!   read:    id well-formed? ─► <id>.json ─► open <id> (O_NOFOLLOW)
//! ```
//!
//! Memory is constant in the file size both ways (one copy buffer; reads are streamed by the
//! route). A crash leaves at most a `.tmp-*` file or a content file without a record; neither
//! is ever served, and [`PromotedStore::open`] removes such leftovers older than an hour.
//!
//! Must never: follow a symlink in the store, serve a file without its record, accept an id
//! that is not exactly the documented shape, or hold a whole file in memory.

use sha2::{Digest, Sha256};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

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

    fn remove_stale(&self) {
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return;
        };
        let now = SystemTime::now();
        for entry in entries.flatten() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            let orphan_content =
                parse_id(&name).is_some() && !self.dir.join(format!("{name}.json")).exists();
            if !(name.starts_with(".tmp-") || orphan_content) {
                continue;
            }
            let old = entry
                .metadata()
                .and_then(|meta| meta.modified())
                .ok()
                .and_then(|modified| now.duration_since(modified).ok())
                .is_some_and(|age| age > STALE_AFTER);
            if old {
                let _ = fs::remove_file(entry.path());
            }
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
        let temp = self.dir.join(format!(".tmp-{id}"));
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
            fs::rename(&temp, self.dir.join(&id))
                .map_err(io_error("cannot commit a promoted file"))?;
            Ok(size)
        })();
        let size = match result {
            Ok(size) => size,
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
        let temp = self.dir.join(format!(".tmp-{}.json", record.id));
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

fn create_new(path: &Path) -> Result<File, PromotedError> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc_o_nofollow())
        .open(path)
        .map_err(io_error(format!("cannot create {}", path.display())))
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
