//! `SqliteStore`: the fence store, the orphan queue, the lease journal and the usage ledger
//! in one embedded SQLite database.
//!
//! One file, WAL journal, `synchronous = FULL`, a busy timeout: several processes on one
//! machine may share it. Every fence operation that writes (`acquire`, `renew`, `publish`,
//! `release`) is one `BEGIN IMMEDIATE` transaction that reads the work item's row, applies
//! the pure transition of [`crate::fence_state`] with the time read *inside* the transaction,
//! and writes the row back; SQLite's single writer lock makes that read-check-write atomic
//! across processes.
//!
//! Statements block, so each port call runs on tokio's blocking pool holding the connection
//! mutex; the async runtime's workers never wait on SQLite.
//!
//! Session tokens and vault secrets (migration 3) live here too: see `credentials.rs`. The
//! database file is created `0600` and narrowed to `0600` on open (`permissions.rs`).
//!
//! Fence tokens: SQLite sees only their SHA-256. The store keeps the tokens it issued in
//! process memory (one per work item, dropped on release or on the next generation) so that
//! a re-entrant `acquire` by the same owner can hand back the same fence, as the contract
//! requires, and so that a token accidentally left in an orphan's error text is redacted
//! before it is written.

mod claims;
pub use claims::WorkItemClaim;
mod credentials;
mod fence;
mod journal;
mod open;
mod orphan;
mod permissions;
mod run_queue;
pub(crate) mod schema;
mod sessions;
mod usage;

use crate::clock::{Clock, SystemClock};
use crate::token::{RandomTokens, TokenSource};
use crate::{StoreError, error::chain};
use omabox_contract::{PortError, SecretString};
use rusqlite::Connection;
use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use schema::{APPLICATION_ID, SCHEMA_VERSION};

/// How long a statement waits for another connection's write lock before failing.
pub const DEFAULT_BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// The SQLite implementation of [`omabox_contract::RuntimeResourceFencePort`],
/// [`omabox_contract::RuntimeOrphanPort`], and omabox's own
/// [`omabox_contract::RuntimeLeaseJournalPort`] (which needs the fence table to tell an
/// abandoned lease) and [`omabox_contract::UsageLedgerPort`].
#[derive(Clone)]
pub struct SqliteStore {
    inner: Arc<Mutex<Inner>>,
    clock: Arc<dyn Clock>,
    tokens: Arc<dyn TokenSource>,
    path: Option<PathBuf>,
}

/// The connection and the tokens this process issued, guarded together so a token is
/// remembered exactly when its generation commits.
struct Inner {
    conn: Connection,
    issued: HashMap<String, IssuedToken>,
}

/// The token of the generation this process last claimed for a work item.
struct IssuedToken {
    generation: u64,
    token: SecretString,
}

impl Inner {
    /// `message` with every token this process holds replaced by `[redacted]`.
    fn redact(&self, message: &str) -> String {
        self.issued
            .values()
            .filter(|issued| !issued.token.expose().is_empty())
            .fold(message.to_owned(), |text, issued| {
                text.replace(issued.token.expose(), "[redacted]")
            })
    }
}

/// What a blocking operation needs besides the connection.
struct Env {
    clock: Arc<dyn Clock>,
    tokens: Arc<dyn TokenSource>,
}

impl SqliteStore {
    /// Opens (creating it and its parent directories if needed) and migrates the database at
    /// `path`. Blocks; call it at startup or from `spawn_blocking`.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        Self::open_with_timeout(path, DEFAULT_BUSY_TIMEOUT)
    }

    /// [`SqliteStore::open`] with an explicit busy timeout.
    pub fn open_with_timeout(
        path: impl AsRef<Path>,
        busy_timeout: Duration,
    ) -> Result<Self, StoreError> {
        let path = path.as_ref();
        let conn = open::open_or_create(path, busy_timeout)?;
        Ok(Self::from_migrated(conn, Some(path.to_owned())))
    }

    /// Opens the database at `path` only if it exists (`None` otherwise): for commands that
    /// only read and must not create a data directory. Checked and migrated like
    /// [`SqliteStore::open`].
    pub fn open_if_exists(path: impl AsRef<Path>) -> Result<Option<Self>, StoreError> {
        let path = path.as_ref();
        match std::fs::symlink_metadata(path) {
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
            _ => {
                let conn = open::open_existing(path, DEFAULT_BUSY_TIMEOUT)?;
                Ok(Some(Self::from_migrated(conn, Some(path.to_owned()))))
            }
        }
    }

    /// A private in-memory database (tests, dry runs). Not shared with any other connection.
    pub fn open_in_memory() -> Result<Self, StoreError> {
        let opened = Connection::open_in_memory()
            .and_then(|conn| configure(&conn, DEFAULT_BUSY_TIMEOUT).map(|()| conn));
        let conn = opened.map_err(|source| StoreError::Open {
            path: PathBuf::from(":memory:"),
            source,
        })?;
        Self::from_connection(conn, None)
    }

    fn from_connection(mut conn: Connection, path: Option<PathBuf>) -> Result<Self, StoreError> {
        schema::migrate(&mut conn, Path::new(":memory:"))?;
        Ok(Self::from_migrated(conn, path))
    }

    fn from_migrated(conn: Connection, path: Option<PathBuf>) -> Self {
        Self {
            inner: Arc::new(Mutex::new(Inner {
                conn,
                issued: HashMap::new(),
            })),
            clock: Arc::new(SystemClock),
            tokens: Arc::new(RandomTokens),
            path,
        }
    }

    /// Uses `clock` for "now" (for example a [`crate::ManualClock`]).
    pub fn with_clock(mut self, clock: impl Clock + 'static) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// Uses `tokens` to issue the token of each new generation.
    pub fn with_token_source(mut self, tokens: impl TokenSource + 'static) -> Self {
        self.tokens = Arc::new(tokens);
        self
    }

    /// The database file, or `None` for an in-memory database.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// The schema version recorded in the database. Blocks briefly.
    pub fn schema_version(&self) -> Result<u32, StoreError> {
        let inner = lock(&self.inner);
        Ok(inner
            .conn
            .pragma_query_value(None, "user_version", |row| row.get(0))?)
    }

    /// Runs `operation` on the blocking pool with the connection; maps failures to a
    /// [`PortError`] naming the operation. No token is ever part of the message: SQLite never
    /// sees one, and the store formats none.
    async fn run<T, F>(&self, operation: &'static str, work: F) -> Result<T, PortError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Inner, &Env) -> Result<T, StoreError> + Send + 'static,
    {
        let inner = Arc::clone(&self.inner);
        let path = self.path.clone();
        let env = Env {
            clock: Arc::clone(&self.clock),
            tokens: Arc::clone(&self.tokens),
        };
        let outcome = tokio::task::spawn_blocking(move || {
            let mut guard = lock(&inner);
            work(&mut guard, &env)
        })
        .await
        .unwrap_or_else(|join| Err(StoreError::Worker(join.to_string())));
        outcome.map_err(|error| {
            // A disk that filled up, or a data dir remounted read-only, since the open.
            let error = match &path {
                Some(path) => open::explain(error, path),
                None => error,
            };
            tracing::warn!(operation, error = %chain(&error), "store operation failed");
            PortError::new(format!(
                "SQLite store {operation} failed: {}",
                chain(&error)
            ))
        })
    }
}

fn lock(inner: &Mutex<Inner>) -> std::sync::MutexGuard<'_, Inner> {
    // A panic while holding the lock may have interrupted a transaction, which SQLite rolls
    // back when the Transaction value drops; the connection itself stays usable.
    inner
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Busy timeout, WAL journal, full sync, foreign keys.
fn configure(conn: &Connection, busy_timeout: Duration) -> rusqlite::Result<()> {
    conn.busy_timeout(busy_timeout)?;
    // Switching a new database to WAL needs an exclusive lock. When several processes open a
    // fresh file at once SQLite may report busy here without waiting, so retry until the
    // busy timeout.
    let deadline = Instant::now() + busy_timeout;
    loop {
        match conn
            .pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get::<_, String>(0))
        {
            Ok(_) => break,
            Err(rusqlite::Error::SqliteFailure(failure, _))
                if failure.code == rusqlite::ErrorCode::DatabaseBusy
                    && Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(error) => return Err(error),
        }
    }
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    Ok(())
}

impl fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

/// A stored integer that must fit the contract's `u64`.
fn to_u64(value: i64, what: &str) -> Result<u64, StoreError> {
    u64::try_from(value).map_err(|_| StoreError::Corrupt(format!("negative {what}: {value}")))
}

/// A contract `u64` as SQLite's `INTEGER`.
fn to_i64(value: u64, what: &str) -> Result<i64, StoreError> {
    i64::try_from(value)
        .map_err(|_| StoreError::Corrupt(format!("{what} {value} does not fit SQLite's INTEGER")))
}

/// The scope stored in four consecutive columns (workspace, environment, session, work id)
/// starting at `first`: the layout of every table keyed by a work item.
pub(super) fn scope_at(
    row: &rusqlite::Row<'_>,
    first: usize,
) -> rusqlite::Result<omabox_contract::scope::RuntimeResourceScope> {
    Ok(omabox_contract::scope::RuntimeResourceScope::new(
        row.get::<_, String>(first)?,
        row.get::<_, String>(first + 1)?,
        row.get::<_, String>(first + 2)?,
        row.get::<_, String>(first + 3)?,
    ))
}
