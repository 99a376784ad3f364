//! Opening the database file: never silently recreate, never use an unchecked file.
//!
//! - **A missing database is created whole.** The schema is built in a private temp file next
//!   to it (`.omabox.db.new-<pid>-<random>`, mode `0600`), checkpointed into the main file and
//!   closed, then hard-linked to its name (no-clobber). So the name only ever holds a complete
//!   omabox store; a racing creator that loses the link opens the winner's file. A crash leaves
//!   at most a temp file, which the next open removes once it is older than a minute.
//! - **An existing file is checked before anything writes to it**: not empty, a SQLite file,
//!   omabox's `application_id` (or an empty database), and `PRAGMA quick_check` clean. Anything
//!   else is refused with an error naming the file and what to do ([`StoreError::NotAStore`],
//!   [`StoreError::Damaged`]); it is never modified, recreated or migrated.
//! - **A read-only data directory** is reported as such ([`StoreError::NotWritable`]): a
//!   writer checks the directory before anything else (SQLite would otherwise open the file
//!   read-only without a word, and the first write — a fence claim — would fail), and a
//!   database SQLite opened read-only is refused to a writer.
//! - **A full filesystem** is named as such ([`StoreError::NoSpace`]): an open or a statement
//!   failing with SQLite's "full", an I/O error (its WAL shared-memory file cannot grow) or
//!   `ENOSPC`, while the data directory's filesystem has less than [`FULL_BELOW`] bytes or no
//!   inode left, is that — not the shared-memory error SQLite reports ([`explain`]).
//!
//! What this module must never do: truncate, replace or delete an existing database.

use super::{configure, permissions, schema};
use crate::StoreError;
use crate::error::chain;
use rusqlite::{Connection, OpenFlags};
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Prefix of the temp files a creation builds the database in.
const TEMP_PREFIX: &str = ".omabox.db.new-";
/// A temp file older than this is an abandoned creation.
const TEMP_STALE: Duration = Duration::from_secs(60);
/// How many problems of `quick_check` an error quotes.
const QUICK_CHECK_LINES: usize = 3;
/// A filesystem with less than this available is full for SQLite's purposes (its WAL index
/// grows by 32 KiB, its WAL by pages; a checkpoint needs room for both).
pub(super) const FULL_BELOW: u64 = 1 << 20;

/// Opens the database at `path` (creating it, and its directory, when missing), checked and
/// migrated.
pub(super) fn open_or_create(
    path: &Path,
    busy_timeout: Duration,
) -> Result<Connection, StoreError> {
    open_for_writing(path, busy_timeout).map_err(|error| explain(error, path))
}

fn open_for_writing(path: &Path, busy_timeout: Duration) -> Result<Connection, StoreError> {
    check_writable_dir(path)?;
    match std::fs::symlink_metadata(path) {
        // A creation that crashed left its temp file next to the database: remove it now.
        Ok(_) => remove_stale_temps(path.parent().unwrap_or(Path::new("."))),
        Err(error)
            if matches!(
                error.kind(),
                io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
            ) =>
        {
            create(path, busy_timeout)?
        }
        Err(source) => return Err(inspect_error(path, source)),
    }
    let conn = open_checked(path, busy_timeout)?;
    // SQLite opens a file it cannot write read-only, silently (a read-only mount, a file of
    // another user): a writer's first write would fail, after a fence was claimed or not.
    if conn.is_readonly(rusqlite::MAIN_DB).unwrap_or(false) {
        return Err(StoreError::NotWritable {
            path: path.parent().unwrap_or(path).to_owned(),
            source: io::Error::new(
                io::ErrorKind::ReadOnlyFilesystem,
                format!("SQLite can open {} only for reading", path.display()),
            ),
        });
    }
    Ok(conn)
}

/// A writer's data directory, when it exists, must be writable by this process.
fn check_writable_dir(path: &Path) -> Result<(), StoreError> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    match rustix::fs::accessat(
        rustix::fs::CWD,
        dir,
        rustix::fs::Access::WRITE_OK,
        rustix::fs::AtFlags::EACCESS,
    ) {
        Err(errno)
            if [
                rustix::io::Errno::ROFS,
                rustix::io::Errno::ACCESS,
                rustix::io::Errno::PERM,
            ]
            .contains(&errno) =>
        {
            Err(StoreError::NotWritable {
                path: dir.to_owned(),
                source: errno.into(),
            })
        }
        // Missing (created next) or anything else: the open says what it is.
        _ => Ok(()),
    }
}

/// Opens the existing database at `path`, checked and migrated. On a read-only filesystem
/// (where SQLite cannot make the WAL's shared-memory file) it is opened `immutable` for
/// reading: nothing can write it there.
pub(super) fn open_existing(path: &Path, busy_timeout: Duration) -> Result<Connection, StoreError> {
    match open_checked(path, busy_timeout) {
        Err(error) if on_read_only_mount(path) => open_immutable(path).map_err(|immutable| {
            tracing::debug!(error = %chain(&error), "the read-write open failed");
            explain(immutable, path)
        }),
        result => result.map_err(|error| explain(error, path)),
    }
}

/// True when the filesystem holding `path` is mounted read-only.
fn on_read_only_mount(path: &Path) -> bool {
    rustix::fs::statvfs(path)
        .is_ok_and(|stat| stat.f_flag.contains(rustix::fs::StatVfsMountFlags::RDONLY))
}

/// `path` opened read-only and `immutable` (no locks, no WAL index): checked, never migrated.
fn open_immutable(path: &Path) -> Result<Connection, StoreError> {
    let mut uri = String::from("file:");
    for c in path.to_string_lossy().chars() {
        match c {
            '%' | '?' | '#' => uri.push_str(&format!("%{:02X}", c as u32)),
            c => uri.push(c),
        }
    }
    uri.push_str("?immutable=1");
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY
        | OpenFlags::SQLITE_OPEN_URI
        | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn =
        Connection::open_with_flags(&uri, flags).map_err(|source| open_error(path, source))?;
    let version = schema::check_identity(&conn, path)?;
    quick_check(&conn, path)?;
    if version > schema::SCHEMA_VERSION {
        return Err(StoreError::SchemaTooNew {
            path: path.to_owned(),
            found: version,
            supported: schema::SCHEMA_VERSION,
        });
    }
    if version < schema::SCHEMA_VERSION {
        return Err(StoreError::NotWritable {
            path: path.parent().unwrap_or(path).to_owned(),
            source: io::Error::new(
                io::ErrorKind::ReadOnlyFilesystem,
                format!(
                    "the store (schema version {version}) needs migrating to {}, which a \
                     read-only filesystem does not allow",
                    schema::SCHEMA_VERSION
                ),
            ),
        });
    }
    Ok(conn)
}

fn open_checked(path: &Path, busy_timeout: Duration) -> Result<Connection, StoreError> {
    let not_a_store = |reason: &str| StoreError::NotAStore {
        path: path.to_owned(),
        reason: reason.to_owned(),
    };
    let metadata = std::fs::metadata(path).map_err(|source| inspect_error(path, source))?;
    if !metadata.is_file() {
        return Err(not_a_store("it is not a regular file"));
    }
    if metadata.len() == 0 {
        return Err(not_a_store("the file is empty (0 bytes)"));
    }
    // No CREATE flag: a file removed behind our back is an error, not a new empty store.
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let mut conn =
        Connection::open_with_flags(path, flags).map_err(|source| open_error(path, source))?;
    conn.busy_timeout(busy_timeout)
        .map_err(|source| open_error(path, source))?;
    schema::check_identity(&conn, path)?;
    quick_check(&conn, path)?;
    configure(&conn, busy_timeout).map_err(|source| open_error(path, source))?;
    permissions::restrict(path);
    schema::migrate(&mut conn, path)?;
    Ok(conn)
}

/// Builds a new store in a temp file and links it to `path` unless something is there by then.
fn create(path: &Path, busy_timeout: Duration) -> Result<(), StoreError> {
    let dir = match path.parent().filter(|dir| !dir.as_os_str().is_empty()) {
        Some(dir) => dir.to_owned(),
        None => PathBuf::from("."),
    };
    // Owner-only: the data dir holds the live workspace/outputs binding dirs a sandbox
    // writes into, which no other host user may traverse.
    let mut builder = std::fs::DirBuilder::new();
    std::os::unix::fs::DirBuilderExt::mode(builder.recursive(true), 0o700);
    builder.create(&dir).map_err(|source| {
        if is_read_only(&source) {
            StoreError::NotWritable {
                path: dir.clone(),
                source,
            }
        } else {
            StoreError::CreateDir {
                path: dir.clone(),
                source,
            }
        }
    })?;
    remove_stale_temps(&dir);
    let temp = dir.join(format!(
        "{TEMP_PREFIX}{}-{:016x}",
        std::process::id(),
        rand::random::<u64>()
    ));
    let result = build(&temp, busy_timeout).and_then(|()| {
        match std::fs::hard_link(&temp, path) {
            Ok(()) => Ok(()),
            // Another process created it first: use theirs.
            Err(error) if error.kind() == io::ErrorKind::AlreadyExists => Ok(()),
            Err(source) if is_read_only(&source) => Err(StoreError::NotWritable {
                path: dir.clone(),
                source,
            }),
            Err(source) => Err(StoreError::CreateFile {
                path: path.to_owned(),
                source,
            }),
        }
    });
    let _ = std::fs::remove_file(&temp);
    result
}

/// The whole schema in a fresh private file, checkpointed so the file alone holds it.
fn build(temp: &Path, busy_timeout: Duration) -> Result<(), StoreError> {
    let dir = temp.parent().unwrap_or(Path::new("."));
    permissions::create_private(temp).map_err(|source| {
        if is_read_only(&source) {
            StoreError::NotWritable {
                path: dir.to_owned(),
                source,
            }
        } else {
            StoreError::CreateFile {
                path: temp.to_owned(),
                source,
            }
        }
    })?;
    let mut conn = Connection::open(temp).map_err(|source| open_error(temp, source))?;
    configure(&conn, busy_timeout).map_err(|source| open_error(temp, source))?;
    schema::migrate(&mut conn, temp)?;
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
    conn.close()
        .map_err(|(_, source)| open_error(temp, source))?;
    let file = std::fs::File::open(temp).map_err(|source| StoreError::CreateFile {
        path: temp.to_owned(),
        source,
    })?;
    file.sync_all().map_err(|source| StoreError::CreateFile {
        path: temp.to_owned(),
        source,
    })
}

/// `PRAGMA quick_check`: `ok`, or the first few problems.
fn quick_check(conn: &Connection, path: &Path) -> Result<(), StoreError> {
    let damaged = |detail: String| StoreError::Damaged {
        path: path.to_owned(),
        detail,
    };
    let mut statement = match conn.prepare("PRAGMA quick_check") {
        Ok(statement) => statement,
        Err(error) => return Err(check_failure(path, error)),
    };
    let rows = statement
        .query_map([], |row| row.get::<_, String>(0))
        .map_err(|error| check_failure(path, error))?;
    let mut problems = Vec::new();
    for row in rows {
        let line = row.map_err(|error| check_failure(path, error))?;
        if line != "ok" {
            problems.push(line);
        }
        if problems.len() > QUICK_CHECK_LINES {
            break;
        }
    }
    if problems.is_empty() {
        return Ok(());
    }
    let more = if problems.len() > QUICK_CHECK_LINES {
        problems.truncate(QUICK_CHECK_LINES);
        "; …"
    } else {
        ""
    };
    Err(damaged(format!("{}{more}", problems.join("; "))))
}

/// A failure while checking: a corrupt file fails the check itself.
fn check_failure(path: &Path, error: rusqlite::Error) -> StoreError {
    match &error {
        rusqlite::Error::SqliteFailure(failure, message)
            if matches!(
                failure.code,
                rusqlite::ErrorCode::DatabaseCorrupt | rusqlite::ErrorCode::NotADatabase
            ) =>
        {
            StoreError::Damaged {
                path: path.to_owned(),
                detail: message.clone().unwrap_or_else(|| failure.to_string()),
            }
        }
        _ => open_error(path, error),
    }
}

fn open_error(path: &Path, source: rusqlite::Error) -> StoreError {
    if let rusqlite::Error::SqliteFailure(failure, _) = &source {
        match failure.code {
            rusqlite::ErrorCode::ReadOnly => {
                return StoreError::NotWritable {
                    path: path.parent().unwrap_or(path).to_owned(),
                    source: io::Error::new(io::ErrorKind::ReadOnlyFilesystem, source.to_string()),
                };
            }
            rusqlite::ErrorCode::NotADatabase => {
                return StoreError::NotAStore {
                    path: path.to_owned(),
                    reason: "the file is not a SQLite database".to_owned(),
                };
            }
            rusqlite::ErrorCode::DatabaseCorrupt => {
                return StoreError::Damaged {
                    path: path.to_owned(),
                    detail: source.to_string(),
                };
            }
            rusqlite::ErrorCode::CannotOpen if dir_not_writable(path) => {
                return StoreError::NotWritable {
                    path: path.parent().unwrap_or(path).to_owned(),
                    source: io::Error::new(io::ErrorKind::ReadOnlyFilesystem, source.to_string()),
                };
            }
            _ => {}
        }
    }
    StoreError::Open {
        path: path.to_owned(),
        source,
    }
}

fn inspect_error(path: &Path, source: io::Error) -> StoreError {
    StoreError::Open {
        path: path.to_owned(),
        source: rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_CANTOPEN),
            Some(format!("cannot inspect the file: {source}")),
        ),
    }
}

fn is_read_only(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::PermissionDenied | io::ErrorKind::ReadOnlyFilesystem
    )
}

/// True when a probe file cannot be created in `path`'s directory for a read-only reason.
fn dir_not_writable(path: &Path) -> bool {
    let dir = path.parent().unwrap_or(Path::new("."));
    let probe = dir.join(format!("{TEMP_PREFIX}probe-{}", std::process::id()));
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
    {
        Ok(_) => {
            let _ = std::fs::remove_file(&probe);
            false
        }
        Err(error) => is_read_only(&error),
    }
}

/// `error` of an operation on the database at `db`, named for what it is: [`StoreError::NoSpace`]
/// when it may come from a full disk (SQLite's "full", an I/O error, `ENOSPC`/`EDQUOT`) and
/// the data directory's filesystem is full; [`StoreError::NotWritable`] when SQLite found the
/// database read-only. Anything else is returned unchanged.
pub(crate) fn explain(error: StoreError, db: &Path) -> StoreError {
    if matches!(
        error,
        StoreError::NoSpace { .. } | StoreError::NotWritable { .. }
    ) {
        return error;
    }
    let dir = match db.parent().filter(|d| !d.as_os_str().is_empty()) {
        Some(dir) => dir,
        None => Path::new("."),
    };
    let (mut space, mut read_only, mut cannot_open) = (false, false, false);
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(&error);
    while let Some(current) = cause {
        if let Some(rusqlite::Error::SqliteFailure(failure, _)) = current.downcast_ref() {
            match failure.code {
                rusqlite::ErrorCode::DiskFull | rusqlite::ErrorCode::SystemIoFailure => {
                    space = true;
                }
                rusqlite::ErrorCode::CannotOpen => (space, cannot_open) = (true, true),
                rusqlite::ErrorCode::ReadOnly => read_only = true,
                _ => {}
            }
        }
        if let Some(errno) = current
            .downcast_ref::<io::Error>()
            .and_then(io::Error::raw_os_error)
            && [rustix::io::Errno::NOSPC, rustix::io::Errno::DQUOT]
                .contains(&rustix::io::Errno::from_raw_os_error(errno))
        {
            space = true;
        }
        cause = current.source();
    }
    if space && let Some(detail) = full(dir) {
        return StoreError::NoSpace {
            path: dir.to_owned(),
            detail,
        };
    }
    if read_only || (cannot_open && dir_not_writable(db)) {
        return StoreError::NotWritable {
            path: dir.to_owned(),
            source: io::Error::new(io::ErrorKind::ReadOnlyFilesystem, chain(&error)),
        };
    }
    error
}

/// What is left on the filesystem of `dir` (or of its nearest existing ancestor) when that is
/// full; `None` when it is not, or cannot be told.
fn full(dir: &Path) -> Option<String> {
    let existing = dir.ancestors().find(|d| d.exists())?;
    let stat = rustix::fs::statvfs(existing).ok()?;
    if stat.f_files > 0 && stat.f_favail == 0 {
        return Some("no free inodes".to_owned());
    }
    let available = stat.f_bavail.saturating_mul(stat.f_frsize);
    (available < FULL_BELOW).then(|| format!("{available} bytes available"))
}

/// Removes temp files of creations that died (older than [`TEMP_STALE`]).
fn remove_stale_temps(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        if !name.to_string_lossy().starts_with(TEMP_PREFIX) {
            continue;
        }
        let stale = entry
            .metadata()
            .and_then(|meta| meta.modified())
            .ok()
            .and_then(|modified| modified.elapsed().ok())
            .is_some_and(|age| age > TEMP_STALE);
        if stale {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}
