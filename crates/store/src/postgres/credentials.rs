//! Session tokens and the vault over PostgreSQL (`session_token`, `vault_secret`).
//!
//! `session_token` holds only the SHA-256 of each token with the claim it was issued for;
//! `issue` (prune expired rows, refuse a superseded generation, revoke older generations,
//! insert) is one transaction holding the work item's advisory lock, so rotation is atomic
//! across hosts. `verify` reads the time once, after its read.
//!
//! `vault_secret` holds values as given. Values are bound as parameters; errors are built by
//! [`super::describe`], which never includes a server error's `DETAIL` (where a row could be
//! quoted); `names` never reads the value column.

use super::{PostgresStore, scope_at, scope_lock_key, to_i64, to_u64};
use crate::StoreError;
use crate::clock::{expiry, iso_millis};
use crate::memory::{check_vault_name, superseded};
use crate::session_token::{new_session_token, session_token_hash};
use crate::token::TokenHash;
use async_trait::async_trait;
use omabox_contract::{
    IssueSessionTokenInput, PortError, RuntimeResourceScope, SecretString, SessionTokenClaims,
    SessionTokenPort, VaultSecretPort,
};

/// What `issue` decided inside its transaction.
enum Issued {
    Token(SecretString),
    Superseded,
}

impl PostgresStore {
    async fn issue_token(&self, input: &IssueSessionTokenInput) -> Result<Issued, StoreError> {
        let scope = &input.scope;
        let generation = to_i64(input.generation, "generation")?;
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        // The fence's lock key: issuing and the work item's fence writes are serialised.
        tx.execute(
            "SELECT pg_advisory_xact_lock($1)",
            &[&scope_lock_key(scope)],
        )
        .await?;
        let now = self.clock.now_ms();
        tx.execute(
            "DELETE FROM session_token WHERE expires_at_ms <= $1",
            &[&to_i64(now, "time")?],
        )
        .await?;
        let claim = [
            &scope.workspace_id as &(dyn tokio_postgres::types::ToSql + Sync),
            &scope.environment_id,
            &scope.session_id,
            &scope.work_id,
            &generation,
        ];
        let newer: bool = tx
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM session_token
                  WHERE workspace_id = $1 AND environment_id = $2 AND session_id = $3
                    AND work_id = $4 AND generation > $5)",
                &claim,
            )
            .await?
            .try_get(0)?;
        if newer {
            return Ok(Issued::Superseded);
        }
        tx.execute(
            "UPDATE session_token SET revoked = true
              WHERE workspace_id = $1 AND environment_id = $2 AND session_id = $3
                AND work_id = $4 AND generation < $5",
            &claim,
        )
        .await?;
        let token = new_session_token();
        let hash = TokenHash::of(&token);
        tx.execute(
            "INSERT INTO session_token (token_sha256, workspace_id, environment_id, session_id,
                                        work_id, generation, expires_at_ms, revoked)
             VALUES ($1, $2, $3, $4, $5, $6, $7, false)",
            &[
                &hash.as_bytes().as_slice(),
                &scope.workspace_id,
                &scope.environment_id,
                &scope.session_id,
                &scope.work_id,
                &generation,
                &to_i64(expiry(now, input.ttl_ms), "expiry")?,
            ],
        )
        .await?;
        tx.commit().await?;
        Ok(Issued::Token(token))
    }

    async fn verify_token(
        &self,
        hash: TokenHash,
    ) -> Result<Option<SessionTokenClaims>, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_opt(
                "SELECT workspace_id, environment_id, session_id, work_id, generation,
                        expires_at_ms
                   FROM session_token
                  WHERE token_sha256 = $1 AND NOT revoked",
                &[&hash.as_bytes().as_slice()],
            )
            .await?;
        let Some(row) = row else {
            return Ok(None);
        };
        let expires_at_ms = to_u64(row.try_get(5)?, "token expiry")?;
        if self.clock.now_ms() >= expires_at_ms {
            return Ok(None);
        }
        Ok(Some(SessionTokenClaims {
            scope: scope_at(&row, 0)?,
            generation: to_u64(row.try_get(4)?, "generation")?,
            expires_at: iso_millis(expires_at_ms),
        }))
    }

    async fn vault_value(&self, name: &str) -> Result<Option<SecretString>, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_opt("SELECT value FROM vault_secret WHERE name = $1", &[&name])
            .await?;
        row.map(|row| {
            let bytes: Vec<u8> = row.try_get(0)?;
            String::from_utf8(bytes)
                .map(SecretString::new)
                // The message names the secret, never its bytes.
                .map_err(|_| StoreError::Corrupt(format!("vault secret {name:?} is not UTF-8")))
        })
        .transpose()
    }

    async fn vault_names(&self) -> Result<Vec<String>, StoreError> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT name FROM vault_secret ORDER BY name COLLATE \"C\"",
                &[],
            )
            .await?;
        rows.iter()
            .map(|row| Ok(row.try_get::<_, String>(0)?))
            .collect()
    }
}

#[async_trait]
impl SessionTokenPort for PostgresStore {
    async fn issue(&self, input: IssueSessionTokenInput) -> Result<SecretString, PortError> {
        match self
            .issue_token(&input)
            .await
            .map_err(|error| self.port_error("session token issue", error))?
        {
            Issued::Token(token) => Ok(token),
            Issued::Superseded => Err(superseded(input.generation)),
        }
    }

    async fn verify(&self, token: &str) -> Result<Option<SessionTokenClaims>, PortError> {
        let Some(hash) = session_token_hash(token) else {
            return Ok(None);
        };
        self.verify_token(hash)
            .await
            .map_err(|error| self.port_error("session token verify", error))
    }

    async fn revoke(&self, scope: &RuntimeResourceScope, generation: u64) -> Result<(), PortError> {
        let revoke = async {
            self.execute(
                "UPDATE session_token SET revoked = true
                  WHERE workspace_id = $1 AND environment_id = $2 AND session_id = $3
                    AND work_id = $4 AND generation = $5",
                &[
                    &scope.workspace_id,
                    &scope.environment_id,
                    &scope.session_id,
                    &scope.work_id,
                    &to_i64(generation, "generation")?,
                ],
            )
            .await
        };
        revoke
            .await
            .map(drop)
            .map_err(|error| self.port_error("session token revoke", error))
    }

    async fn extend(
        &self,
        scope: &RuntimeResourceScope,
        generation: u64,
        ttl_ms: u64,
    ) -> Result<(), PortError> {
        let extend = async {
            let now = self.clock.now_ms();
            self.execute(
                "UPDATE session_token SET expires_at_ms = $7
                  WHERE workspace_id = $1 AND environment_id = $2 AND session_id = $3
                    AND work_id = $4 AND generation = $5 AND NOT revoked
                    AND expires_at_ms > $6",
                &[
                    &scope.workspace_id,
                    &scope.environment_id,
                    &scope.session_id,
                    &scope.work_id,
                    &to_i64(generation, "generation")?,
                    &to_i64(now, "time")?,
                    &to_i64(expiry(now, ttl_ms), "expiry")?,
                ],
            )
            .await
        };
        extend
            .await
            .map(drop)
            .map_err(|error| self.port_error("session token extend", error))
    }
}

#[async_trait]
impl VaultSecretPort for PostgresStore {
    async fn get(&self, name: &str) -> Result<Option<SecretString>, PortError> {
        self.vault_value(name)
            .await
            .map_err(|error| self.port_error("vault get", error))
    }

    async fn put(&self, name: &str, value: SecretString) -> Result<(), PortError> {
        check_vault_name(name)?;
        let put = async {
            let now = to_i64(self.clock.now_ms(), "time")?;
            self.execute(
                "INSERT INTO vault_secret (name, value, created_at_ms, updated_at_ms)
                 VALUES ($1, $2, $3, $3)
                 ON CONFLICT (name) DO UPDATE
                    SET value = excluded.value, updated_at_ms = excluded.updated_at_ms",
                &[&name, &value.expose().as_bytes(), &now],
            )
            .await
        };
        put.await
            .map(drop)
            .map_err(|error| self.port_error("vault put", error))
    }

    async fn delete(&self, name: &str) -> Result<(), PortError> {
        self.execute("DELETE FROM vault_secret WHERE name = $1", &[&name])
            .await
            .map(drop)
            .map_err(|error| self.port_error("vault delete", error))
    }

    async fn names(&self) -> Result<Vec<String>, PortError> {
        self.vault_names()
            .await
            .map_err(|error| self.port_error("vault names", error))
    }
}
