//! `PostgresStore`: the same ports as [`crate::SqliteStore`] on a PostgreSQL database that
//! several hosts share.
//!
//! Driver: `tokio-postgres` (async, pure Rust) behind a `deadpool-postgres` pool, TLS through
//! rustls as the URL's `sslmode`/`sslrootcert` ask ([`tls`]). Every fence operation that writes (`acquire`, `renew`,
//! `publish`, `release`) is one transaction that first takes a transaction-scoped advisory
//! lock on the work item (`pg_advisory_xact_lock` of 64 bits of the scope's SHA-256), then
//! reads the row, applies the pure transition of [`crate::fence_state`] with the time read
//! *after* the lock, and writes the row back; so two hosts racing on one work item are
//! serialised exactly like two processes on one SQLite file. The time is the store's
//! injected [`Clock`] (the host's clock by default), as in SQLite; the run queue's claims
//! expire by the database's clock instead ([`ClaimClock`]), which every host shares.
//!
//! What this must never do: put a fence or session token in the database (only SHA-256),
//! put a vault value or the database URL's password in an error or a log line, or report a
//! PostgreSQL error's `DETAIL` (it can quote a whole row): see [`describe`].
//!
//! Fence tokens issued by this process are remembered in its memory, as in SQLite, for a
//! re-entrant `acquire` and for redacting orphan error texts.

mod credentials;
mod fence;
mod history;
mod journal;
mod listen;
mod orphan;
mod run_queue;
mod schema;
pub mod tls;
mod usage;

use crate::StoreError;
use crate::clock::{Clock, SystemClock};
use crate::error::chain;
use crate::token::{RandomTokens, TokenSource};
use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod};
use omabox_contract::{PortError, RuntimeResourceScope, SecretString};
use sha2::{Digest as _, Sha256};
use std::collections::HashMap;
use std::fmt;
use std::str::FromStr as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub use listen::{RUNS_CHANNEL, RunListener};
pub use schema::POSTGRES_SCHEMA_VERSION;

/// Connections one store keeps open at most.
pub const DEFAULT_POOL_SIZE: usize = 16;

/// How long opening a connection may take when the URL sets no `connect_timeout`: a server
/// that drops packets is an error naming it, not a command that hangs.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long an operation waits for a connection (a free one of the pool, or a new one
/// through the whole login) before it fails naming the database: a server that accepts and
/// never answers must not hang a command.
pub const DEFAULT_CONNECTION_WAIT: Duration = Duration::from_secs(30);

/// Whose clock decides when a run's claim expired.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimClock {
    /// The database server's (`clock_timestamp()`, read in the claim's transaction): one
    /// clock for every host, so a host whose clock runs ahead never takes a live claim over.
    /// The default.
    Database,
    /// The store's [`Clock`] (tests that move time by hand; what SQLite, one machine, does).
    Store,
}

/// The PostgreSQL implementation of the fence, orphan, lease-journal, usage, session-token
/// and vault ports.
#[derive(Clone)]
pub struct PostgresStore {
    pool: Pool,
    wait: Duration,
    target: String,
    /// For connections outside the pool (the run listener); shared, it is large.
    config: Arc<tokio_postgres::Config>,
    tls: tls::MakeRustls,
    clock: Arc<dyn Clock>,
    claim_clock: ClaimClock,
    tokens: Arc<dyn TokenSource>,
    issued: Arc<Mutex<HashMap<String, IssuedToken>>>,
}

/// The token of the generation this process last claimed for a work item.
#[derive(Clone)]
struct IssuedToken {
    generation: u64,
    token: SecretString,
}

impl PostgresStore {
    /// Connects to the database `url` names (`postgres://user:password@host:port/db`, or the
    /// `key=value` form) and migrates it. The password never appears in an error.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        Self::connect_with_pool_size(url, DEFAULT_POOL_SIZE).await
    }

    /// [`PostgresStore::connect`] with at most `size` connections.
    pub async fn connect_with_pool_size(url: &str, size: usize) -> Result<Self, StoreError> {
        Self::connect_with(url, size, DEFAULT_CONNECTION_WAIT).await
    }

    /// [`PostgresStore::connect`] with at most `size` connections, each operation waiting at
    /// most `wait` for one.
    pub async fn connect_with(url: &str, size: usize, wait: Duration) -> Result<Self, StoreError> {
        let (driver_url, tls_options, verified) = tls::split(url)?;
        let mut config = tokio_postgres::Config::from_str(&driver_url)
            .map_err(|error| StoreError::DatabaseUrl(redact_url_error(&error, url)))?;
        if verified {
            config.ssl_mode(tokio_postgres::config::SslMode::Require);
        }
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(DEFAULT_CONNECT_TIMEOUT);
        }
        let target = describe_target(&config);
        let tls = tls::MakeRustls::new(&tls_options)?;
        let manager = Manager::from_config(
            config.clone(),
            tls.clone(),
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(size.max(1))
            .build()
            .map_err(|error| StoreError::Connect {
                target: target.clone(),
                detail: error.to_string(),
            })?;
        let store = Self {
            pool,
            wait,
            target,
            config: Arc::new(config),
            tls,
            clock: Arc::new(SystemClock),
            claim_clock: ClaimClock::Database,
            tokens: Arc::new(RandomTokens),
            issued: Arc::new(Mutex::new(HashMap::new())),
        };
        let mut client = store.client().await?;
        schema::migrate(&mut client, &store.target).await?;
        Ok(store)
    }

    /// Uses `clock` for "now" (for example a [`crate::ManualClock`]), the run queue's claims
    /// included ([`ClaimClock::Store`]; [`PostgresStore::with_claim_clock`] undoes that).
    pub fn with_clock(mut self, clock: impl Clock + 'static) -> Self {
        self.clock = Arc::new(clock);
        self.claim_clock = ClaimClock::Store;
        self
    }

    /// Whose clock the run queue's claims expire by.
    pub fn with_claim_clock(mut self, claim_clock: ClaimClock) -> Self {
        self.claim_clock = claim_clock;
        self
    }

    /// Uses `tokens` to issue the token of each new generation.
    pub fn with_token_source(mut self, tokens: impl TokenSource + 'static) -> Self {
        self.tokens = Arc::new(tokens);
        self
    }

    /// `user@host:port/database` of the store: what errors and logs name, never a password.
    pub fn target(&self) -> &str {
        &self.target
    }

    /// The schema version recorded in the database.
    pub async fn schema_version(&self) -> Result<u32, StoreError> {
        let client = self.client().await?;
        schema::version(&client).await
    }

    async fn client(&self) -> Result<Object, StoreError> {
        let failed = |detail| StoreError::Connect {
            target: self.target.clone(),
            detail,
        };
        match tokio::time::timeout(self.wait, self.pool.get()).await {
            Ok(client) => client.map_err(|error| failed(describe_pool(&error))),
            Err(_) => Err(failed(format!(
                "no connection within {} s (the server does not answer, or every pooled \
                 connection is busy)",
                self.wait.as_secs()
            ))),
        }
    }

    /// Maps a failure to a [`PortError`] naming the operation, and logs it.
    fn port_error(&self, operation: &'static str, error: StoreError) -> PortError {
        tracing::warn!(operation, error = %chain(&error), "store operation failed");
        PortError::new(format!(
            "PostgreSQL store {operation} failed: {}",
            chain(&error)
        ))
    }

    /// `message` with every token this process holds replaced by `[redacted]`.
    fn redact(&self, message: &str) -> String {
        lock(&self.issued)
            .values()
            .filter(|issued| !issued.token.expose().is_empty())
            .fold(message.to_owned(), |text, issued| {
                text.replace(issued.token.expose(), "[redacted]")
            })
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // The map is only ever replaced entry by entry; a panic mid-update leaves it usable.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresStore")
            .field("target", &self.target)
            .finish_non_exhaustive()
    }
}

impl From<tokio_postgres::Error> for StoreError {
    fn from(error: tokio_postgres::Error) -> Self {
        StoreError::Postgres(describe(&error))
    }
}

/// A driver error as text without anything a row could put there: for a server error its
/// message and SQLSTATE only (never `DETAIL`, which can quote a row, a vault value included).
pub(crate) fn describe(error: &tokio_postgres::Error) -> String {
    match error.as_db_error() {
        Some(db) => format!("{} (SQLSTATE {})", db.message(), db.code().code()),
        None => chain(error),
    }
}

fn describe_pool(error: &deadpool_postgres::PoolError) -> String {
    match error {
        deadpool_postgres::PoolError::Backend(error) => describe(error),
        other => other.to_string(),
    }
}

/// `user@host:port/database`, from the parsed configuration: no password.
fn describe_target(config: &tokio_postgres::Config) -> String {
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(index, host)| {
            let host = match host {
                tokio_postgres::config::Host::Tcp(name) => name.clone(),
                tokio_postgres::config::Host::Unix(path) => path.display().to_string(),
            };
            match config.get_ports().get(index).or(config.get_ports().first()) {
                Some(port) => format!("{host}:{port}"),
                None => host,
            }
        })
        .collect();
    format!(
        "{}@{}/{}",
        config.get_user().unwrap_or("?"),
        hosts.join(","),
        config.get_dbname().unwrap_or("?")
    )
}

/// The driver's URL parse error, with anything of `url` that could be a password removed:
/// the error names an option or a field, and must never echo the URL.
fn redact_url_error(error: &tokio_postgres::Error, url: &str) -> String {
    let text = chain(error);
    if !url.is_empty() && text.contains(url) {
        return "the URL could not be parsed".to_owned();
    }
    match password_of(url) {
        Some(password) if !password.is_empty() && text.contains(password) => {
            text.replace(password, "[redacted]")
        }
        _ => text,
    }
}

/// The password part of `scheme://user:password@…`, if any.
fn password_of(url: &str) -> Option<&str> {
    let rest = url.split_once("://")?.1;
    let userinfo = rest.rsplit_once('@')?.0;
    Some(userinfo.split_once(':')?.1)
}

/// The advisory lock key of a work item: 64 bits of the SHA-256 of its scope key (a collision
/// only serialises two work items' writes).
fn scope_lock_key(scope: &RuntimeResourceScope) -> i64 {
    let digest = Sha256::digest(scope.key().as_bytes());
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&digest[..8]);
    i64::from_be_bytes(bytes)
}

/// A stored integer that must fit the contract's `u64`.
fn to_u64(value: i64, what: &str) -> Result<u64, StoreError> {
    u64::try_from(value).map_err(|_| StoreError::Corrupt(format!("negative {what}: {value}")))
}

/// A contract `u64` as PostgreSQL's `bigint`.
fn to_i64(value: u64, what: &str) -> Result<i64, StoreError> {
    i64::try_from(value)
        .map_err(|_| StoreError::Corrupt(format!("{what} {value} does not fit a bigint")))
}

/// The scope stored in four consecutive columns starting at `first`.
fn scope_at(row: &tokio_postgres::Row, first: usize) -> Result<RuntimeResourceScope, StoreError> {
    Ok(RuntimeResourceScope::new(
        row.try_get::<_, String>(first)?,
        row.try_get::<_, String>(first + 1)?,
        row.try_get::<_, String>(first + 2)?,
        row.try_get::<_, String>(first + 3)?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_target_names_user_host_and_database_but_never_the_password() {
        let config =
            tokio_postgres::Config::from_str("postgres://alice:s3cr3t-pw@db.example:6543/omabox")
                .unwrap();
        let target = describe_target(&config);
        assert_eq!(target, "alice@db.example:6543/omabox");
        assert!(!target.contains("s3cr3t"));
    }

    #[test]
    fn a_bad_url_error_never_echoes_the_password() {
        for url in [
            "postgres://alice:s3cr3t-pw@db.example:notaport/omabox",
            "postgres://alice:s3cr3t-pw@db.example/omabox?bogus=1",
            "s3cr3t-pw",
        ] {
            let error = tokio_postgres::Config::from_str(url).unwrap_err();
            let text = redact_url_error(&error, url);
            assert!(!text.contains("s3cr3t"), "{url}: {text}");
        }
    }

    #[test]
    fn lock_keys_differ_per_work_item() {
        let a = RuntimeResourceScope::new("w", "e", "s", "a");
        let b = RuntimeResourceScope::new("w", "e", "s", "b");
        assert_ne!(scope_lock_key(&a), scope_lock_key(&b));
        assert_eq!(scope_lock_key(&a), scope_lock_key(&a.clone()));
    }
}
