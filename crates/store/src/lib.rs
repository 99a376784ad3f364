//! Durable state for omabox: who owns a work item (the fence store), which resources are
//! authoritative for it (the publication pointer), which compute still needs reaping (the
//! orphan queue), which compute is alive at all (the lease journal, an omabox extension), and
//! how long it ran (the usage ledger, an omabox extension).
//!
//! Two implementations of [`RuntimeResourceFencePort`], [`RuntimeOrphanPort`],
//! [`RuntimeLeaseJournalPort`] and [`UsageLedgerPort`]:
//!
//! - [`SqliteStore`]: one embedded SQLite file (WAL, busy timeout), shareable by several
//!   processes on one machine. The default for a single host.
//! - [`MemoryFenceStore`], [`MemoryOrphanStore`], [`MemoryLeaseJournal`] (over a
//!   `MemoryFenceStore`, whose fence state decides "abandoned") and [`MemoryUsageLedger`]:
//!   in-memory twins with exactly the reference implementation's semantics where the
//!   reference has one, for tests.
//!
//! The same two shapes implement the credential ports of `omabox_contract::credentials`:
//! [`SessionTokenPort`] (`SqliteStore`, [`MemorySessionTokens`]) and [`VaultSecretPort`]
//! (`SqliteStore`, [`MemoryVault`]).
//!
//! The run queue ([`RunQueuePort`], issue 30: runs accepted over HTTP, claimed by any host)
//! is on all three: [`SqliteStore`], [`PostgresStore`] and [`MemoryRunQueue`] (over a
//! `MemoryFenceStore`, through which it publishes). A run's publication and the revision it
//! records on the run are one transaction, taken only while the run's claim is live.
//!
//! Both fence stores run the same pure state machine ([`FenceRecord`]), and one behavioural
//! suite (`tests/ports.rs`) runs against both.
//!
//! Invariants this crate keeps:
//!
//! - **A fence token is never stored.** Tokens come from a CSPRNG ([`RandomTokens`]); the
//!   database holds only their SHA-256 ([`TokenHash`]), and no error text or log line carries
//!   a token. Orphan error texts are redacted once more against every token this process
//!   holds before they are written.
//! - **A session token is never stored either.** `omst_` + 256 CSPRNG bits in base64url
//!   ([`new_session_token`]); stores keep its SHA-256 and the claim (scope, generation,
//!   expiry, revoked). Issuing for a generation revokes every older generation's tokens of
//!   the same work item in the same transaction (rotation on reclaim); issuing for a
//!   generation older than one already issued is refused.
//! - **Vault values are stored, never shown.** They sit in the database, which is therefore
//!   created `0600` (its `-wal`/`-shm` inherit that mode); no error, log line or `Debug`
//!   output carries a value, and `names` reads only names.
//! - **A journaled lease is abandoned exactly when its generation no longer holds the fence**
//!   (taken over, released, or expired by the store's clock); the lease journal and the
//!   usage ledger have no token column.
//! - **Usage is counted once.** At most one usage record per `(kind, provider, runtimeId)`,
//!   whole seconds clamped to 24 h.
//! - **Publish is atomic.** `publish` checks generation, token and expiry and advances the
//!   active pointer in one write transaction; there is no separate check-then-publish.
//!   `acquire`, `renew` and `release` are single transactions too, so two processes racing
//!   to acquire a work item get exactly one new generation.
//! - **Expiry is decided with one clock read per operation**, taken while the store holds
//!   its lock or write transaction. The clock is injectable ([`Clock`], [`ManualClock`]).
//! - **Schema changes are explicit.** The schema version is `PRAGMA user_version`; ordered
//!   migrations run in one transaction; a database newer than this build is refused
//!   ([`StoreError::SchemaTooNew`]).
//! - **An existing database is never recreated or used unchecked.** A missing database is
//!   built in a temp file and linked into place whole; an existing one that is empty, not
//!   SQLite, another application's, or fails `PRAGMA quick_check` is refused with an error
//!   naming the file ([`StoreError::NotAStore`], [`StoreError::Damaged`]) and never modified;
//!   [`SqliteStore::open_if_exists`] lets read-only commands create nothing.
//!
//! Known difference from the reference: a re-entrant `acquire` (same owner id, unexpired
//! fence) returns the same fence only in the process that acquired it, because only that
//! process knows the token. Any other process — including the same owner after a restart —
//! gets `conflict` until the fence expires, exactly like a different owner.

#![forbid(unsafe_code)]

mod clock;
mod error;
mod fence_state;
mod memory;
mod postgres;
mod session_token;
mod sqlite;
mod token;

pub use clock::{Clock, MAX_TIMESTAMP_MS, ManualClock, SystemClock, iso_millis};
pub use error::StoreError;
pub use fence_state::{ActiveFence, FenceRecord, TokenProof};
pub use memory::{
    MemoryFenceRecord, MemoryFenceStore, MemoryLeaseJournal, MemoryOrphanStore, MemoryRunQueue,
    MemorySessionTokens, MemoryUsageLedger, MemoryVault,
};
pub use postgres::{
    ClaimClock, DEFAULT_CONNECT_TIMEOUT, DEFAULT_CONNECTION_WAIT, DEFAULT_POOL_SIZE,
    POSTGRES_SCHEMA_VERSION, PostgresStore, RUNS_CHANNEL, RunListener,
};
pub use session_token::{
    SESSION_TOKEN_LEN, SESSION_TOKEN_PREFIX, new_session_token, session_token_hash,
};
pub use sqlite::{
    APPLICATION_ID, DEFAULT_BUSY_TIMEOUT, SCHEMA_VERSION, SqliteStore, WorkItemClaim,
};
pub use token::{RandomTokens, TokenHash, TokenSource};

#[doc(no_inline)]
pub use omabox_contract::{
    RunQueuePort, RuntimeLeaseJournalPort, RuntimeOrphanPort, RuntimeResourceFencePort,
    SessionTokenPort, UsageLedgerPort, VaultSecretPort,
};
