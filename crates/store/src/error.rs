//! Errors of opening, migrating and querying the SQLite store.

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
    /// The database was written by a newer omabox.
    #[error(
        "the store database has schema version {found}, newer than the {supported} this omabox \
         understands; upgrade omabox or use another data directory"
    )]
    SchemaTooNew {
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
