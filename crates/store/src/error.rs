//! Errors of opening, migrating and querying the store (SQLite or PostgreSQL).

use std::path::PathBuf;

/// Why the SQLite store could not be opened or could not complete an operation.
///
/// No variant carries a fence token: the store never hands one to SQLite.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The directory that holds the database could not be created.
    #[error("cannot create the store directory {path}")]
    CreateDir {
        /// The directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The database file could not be created (owner-only, mode `0600`).
    #[error("cannot create the store database {path}")]
    CreateFile {
        /// The database file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The database file could not be opened or configured.
    #[error("cannot open the store database {path}")]
    Open {
        /// The database file (`:memory:` for an in-memory database).
        path: PathBuf,
        /// Why.
        #[source]
        source: rusqlite::Error,
    },
    /// An existing file where the database belongs is not an omabox store: empty, not
    /// SQLite, or another application's database. It is never overwritten.
    #[error(
        "{path} is not an omabox store database ({reason}); omabox never overwrites or \
         recreates it: move it aside (or restore it from a backup), or use another data directory"
    )]
    NotAStore {
        /// The database file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The database fails SQLite's `PRAGMA quick_check`.
    #[error(
        "the store database {path} is damaged (PRAGMA quick_check: {detail}); omabox does not \
         repair or recreate it: restore it from a backup, or move it aside and use another data \
         directory"
    )]
    Damaged {
        /// The database file.
        path: PathBuf,
        /// The first problems `quick_check` reported.
        detail: String,
    },
    /// The data directory (or the database in it) cannot be written.
    #[error(
        "the data directory {path} is not writable; omabox keeps its store database there: make \
         it writable, or use another data directory"
    )]
    NotWritable {
        /// The directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The filesystem of the data directory is full (blocks or inodes): SQLite cannot grow
    /// the database, its WAL or its shared-memory file.
    #[error(
        "no space left on device: the filesystem of the data directory {path} is full \
         ({detail}); omabox keeps its store database there: free space on that filesystem, or \
         use another data directory"
    )]
    NoSpace {
        /// The directory.
        path: PathBuf,
        /// What is left (`0 bytes available`, `no free inodes`).
        detail: String,
    },
    /// The database was written by a newer omabox.
    #[error(
        "the store database {path} has schema version {found}, newer than the {supported} this \
         omabox understands; upgrade omabox or use another data directory"
    )]
    SchemaTooNew {
        /// The database file.
        path: PathBuf,
        /// The version recorded in the database.
        found: u32,
        /// The newest version this build knows.
        supported: u32,
    },
    /// A migration step failed; the database is left at its previous version.
    #[error("cannot migrate the store schema to version {version} ({description})")]
    Migrate {
        /// The version the failed step leads to.
        version: u32,
        /// What the step does.
        description: &'static str,
        /// Why.
        #[source]
        source: rusqlite::Error,
    },
    /// A statement failed (busy beyond the timeout, disk full, I/O error, …).
    #[error("store query failed")]
    Query(#[from] rusqlite::Error),
    /// A stored value could not be read back (a hand-edited or corrupt database).
    #[error("corrupt store record: {0}")]
    Corrupt(String),
    /// The PostgreSQL database URL could not be parsed. Never carries the URL.
    #[error(
        "invalid PostgreSQL database URL ({0}); expected postgres://USER:PASSWORD@HOST:PORT/DATABASE"
    )]
    DatabaseUrl(String),
    /// The TLS settings of the PostgreSQL URL cannot be used (an unreadable or empty
    /// `sslrootcert`, no system roots). Never carries the URL.
    #[error("cannot set up TLS to the PostgreSQL store: {0}")]
    Tls(String),
    /// The PostgreSQL database could not be reached, or refused the login.
    #[error("cannot connect to the PostgreSQL store {target}: {detail}")]
    Connect {
        /// `user@host:port/database` (never the password).
        target: String,
        /// Why (the driver's text, without a server error's DETAIL).
        detail: String,
    },
    /// The PostgreSQL database was migrated by a newer omabox.
    #[error(
        "the PostgreSQL store {target} has schema version {found}, newer than the {supported} \
         this omabox understands; upgrade omabox on this host"
    )]
    DatabaseSchemaTooNew {
        /// `user@host:port/database`.
        target: String,
        /// The version recorded in the database.
        found: u32,
        /// The newest version this build knows.
        supported: u32,
    },
    /// A PostgreSQL migration step failed; the database is left at its previous version.
    #[error(
        "cannot migrate the PostgreSQL store schema to version {version} ({description}): {detail}"
    )]
    MigrateDatabase {
        /// The version the failed step leads to.
        version: u32,
        /// What the step does.
        description: &'static str,
        /// Why.
        detail: String,
    },
    /// A PostgreSQL statement failed (its message and SQLSTATE, never its DETAIL).
    #[error("PostgreSQL store query failed: {0}")]
    Postgres(String),
    /// A run id given to `enqueue` that the queue already holds.
    #[error("run {0} is already queued")]
    DuplicateRun(String),
    /// The blocking worker running the statement failed.

    #[error("store worker failed: {0}")]
    Worker(String),
}

/// `error: source: source…`, for messages that must stand alone (a [`PortError`] has no
/// source chain).
///
/// [`PortError`]: omabox_contract::PortError
pub(crate) fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
