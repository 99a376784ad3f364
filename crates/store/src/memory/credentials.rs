//! `MemorySessionTokens` and `MemoryVault`: the in-memory twins of the SQLite session-token
//! table and vault (omabox extensions). Same semantics, same invariants: a session token is
//! held only as its SHA-256, and no error or `Debug` output carries a token or a value.

use crate::clock::{Clock, SystemClock, expiry, iso_millis};
use crate::session_token::{new_session_token, session_token_hash};
use crate::token::TokenHash;
use async_trait::async_trait;
use omabox_contract::{
    IssueSessionTokenInput, PortError, RuntimeResourceScope, SecretString, SessionTokenClaims,
    SessionTokenPort, VaultSecretPort,
};
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every mutation leaves the map consistent (one insert, or flag updates), so a poisoned
    // lock is still usable.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// What a store keeps of one issued session token.
#[derive(Debug, Clone)]
struct TokenRow {
    scope: RuntimeResourceScope,
    generation: u64,
    expires_at_ms: u64,
    revoked: bool,
}

/// An in-memory [`SessionTokenPort`] keyed by token hash.
pub struct MemorySessionTokens {
    rows: Mutex<HashMap<TokenHash, TokenRow>>,
    clock: Arc<dyn Clock>,
}

impl MemorySessionTokens {
    /// An empty store on the system clock.
    pub fn new() -> Self {
        Self {
            rows: Mutex::new(HashMap::new()),
            clock: Arc::new(SystemClock),
        }
    }

    /// Uses `clock` for issue and expiry (for example a [`crate::ManualClock`]).
    pub fn with_clock(mut self, clock: impl Clock + 'static) -> Self {
        self.clock = Arc::new(clock);
        self
    }
}

impl Default for MemorySessionTokens {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for MemorySessionTokens {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemorySessionTokens")
            .field("tokens", &lock(&self.rows).len())
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl SessionTokenPort for MemorySessionTokens {
    async fn issue(&self, input: IssueSessionTokenInput) -> Result<SecretString, PortError> {
        let mut rows = lock(&self.rows);
        let now = self.clock.now_ms();
        // Expired rows can never verify again; dropping them keeps the map bounded.
        rows.retain(|_, row| row.expires_at_ms > now);
        let same_work = |row: &TokenRow| row.scope == input.scope;
        if rows
            .values()
            .any(|row| same_work(row) && row.generation > input.generation)
        {
            return Err(superseded(input.generation));
        }
        for row in rows.values_mut() {
            if same_work(row) && row.generation < input.generation {
                row.revoked = true;
            }
        }
        let token = new_session_token();
        rows.insert(
            TokenHash::of(&token),
            TokenRow {
                scope: input.scope,
                generation: input.generation,
                expires_at_ms: expiry(now, input.ttl_ms),
                revoked: false,
            },
        );
        Ok(token)
    }

    async fn verify(&self, token: &str) -> Result<Option<SessionTokenClaims>, PortError> {
        let Some(hash) = session_token_hash(token) else {
            return Ok(None);
        };
        let rows = lock(&self.rows);
        let now = self.clock.now_ms();
        Ok(rows
            .get(&hash)
            .filter(|row| !row.revoked && now < row.expires_at_ms)
            .map(|row| SessionTokenClaims {
                scope: row.scope.clone(),
                generation: row.generation,
                expires_at: iso_millis(row.expires_at_ms),
            }))
    }

    async fn revoke(&self, scope: &RuntimeResourceScope, generation: u64) -> Result<(), PortError> {
        for row in lock(&self.rows).values_mut() {
            if &row.scope == scope && row.generation == generation {
                row.revoked = true;
            }
        }
        Ok(())
    }

    async fn extend(
        &self,
        scope: &RuntimeResourceScope,
        generation: u64,
        ttl_ms: u64,
    ) -> Result<(), PortError> {
        let now = self.clock.now_ms();
        for row in lock(&self.rows).values_mut() {
            let live = !row.revoked && now < row.expires_at_ms;
            if live && &row.scope == scope && row.generation == generation {
                row.expires_at_ms = expiry(now, ttl_ms);
            }
        }
        Ok(())
    }
}

/// The error of issuing for a generation older than one already issued for the work item: a
/// stale claimant must not mint a live token after the reclaim rotated it out.
pub(crate) fn superseded(generation: u64) -> PortError {
    PortError::new(format!(
        "cannot issue a session token for generation {generation}: a newer generation of the \
         work item already holds one"
    ))
}

/// A vault name must be non-empty (names are not secret and may appear in errors).
pub(crate) fn check_vault_name(name: &str) -> Result<(), PortError> {
    if name.is_empty() {
        return Err(PortError::new("vault secret name must not be empty"));
    }
    Ok(())
}

/// An in-memory [`VaultSecretPort`]: names in sorted order.
#[derive(Default)]
pub struct MemoryVault {
    secrets: Mutex<BTreeMap<String, SecretString>>,
}

impl MemoryVault {
    /// An empty vault.
    pub fn new() -> Self {
        Self::default()
    }
}

impl fmt::Debug for MemoryVault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryVault")
            .field("secrets", &lock(&self.secrets).len())
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl VaultSecretPort for MemoryVault {
    async fn get(&self, name: &str) -> Result<Option<SecretString>, PortError> {
        Ok(lock(&self.secrets).get(name).cloned())
    }

    async fn put(&self, name: &str, value: SecretString) -> Result<(), PortError> {
        check_vault_name(name)?;
        lock(&self.secrets).insert(name.to_owned(), value);
        Ok(())
    }

    async fn delete(&self, name: &str) -> Result<(), PortError> {
        lock(&self.secrets).remove(name);
        Ok(())
    }

    async fn names(&self) -> Result<Vec<String>, PortError> {
        Ok(lock(&self.secrets).keys().cloned().collect())
    }
}
