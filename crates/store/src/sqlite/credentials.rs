//! Session tokens and the vault over SQLite (`session_token`, `vault_secret`; migration 3).
//!
//! `session_token` holds only the SHA-256 of each token with the claim it was issued for;
//! `issue` (prune expired rows, refuse a superseded generation, revoke older generations,
//! insert) is one `BEGIN IMMEDIATE` transaction, so rotation is atomic across processes.
//! `verify` reads the time once, after its read.
//!
//! `vault_secret` holds values as given: the vault is the one table whose whole point is to
//! keep a secret, so the file is created `0600` (see `permissions.rs`). Values are bound as
//! statement parameters, which SQLite never copies into an error message; no error built here
//! formats a value, and `names` never reads the value column.

use super::scope_at;
use super::{SqliteStore, to_i64, to_u64};
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
use rusqlite::{OptionalExtension, TransactionBehavior, params};

/// What `issue` decided inside its transaction.
enum Issued {
    Token(SecretString),
    Superseded,
}

#[async_trait]
impl SessionTokenPort for SqliteStore {
    async fn issue(&self, input: IssueSessionTokenInput) -> Result<SecretString, PortError> {
        let generation = input.generation;
        let issued = self
            .run("session token issue", move |inner, env| {
                let scope = &input.scope;
                let generation = to_i64(input.generation, "generation")?;
                let tx = inner
                    .conn
                    .transaction_with_behavior(TransactionBehavior::Immediate)?;
                let now = env.clock.now_ms();
                tx.execute(
                    "DELETE FROM session_token WHERE expires_at_ms <= ?1",
                    params![to_i64(now, "time")?],
                )?;
                let newer: bool = tx.query_row(
                    "SELECT EXISTS (SELECT 1 FROM session_token
                      WHERE workspace_id = ?1 AND environment_id = ?2 AND session_id = ?3
                        AND work_id = ?4 AND generation > ?5)",
                    params![
                        scope.workspace_id,
                        scope.environment_id,
                        scope.session_id,
                        scope.work_id,
                        generation
                    ],
                    |row| row.get(0),
                )?;
                if newer {
                    return Ok(Issued::Superseded);
                }
                tx.execute(
                    "UPDATE session_token SET revoked = 1
                      WHERE workspace_id = ?1 AND environment_id = ?2 AND session_id = ?3
                        AND work_id = ?4 AND generation < ?5",
                    params![
                        scope.workspace_id,
                        scope.environment_id,
                        scope.session_id,
                        scope.work_id,
                        generation
                    ],
                )?;
                let token = new_session_token();
                tx.execute(
                    "INSERT INTO session_token (token_sha256, workspace_id, environment_id,
                                                session_id, work_id, generation, expires_at_ms,
                                                revoked)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 0)",
                    params![
                        TokenHash::of(&token).as_bytes().as_slice(),
                        scope.workspace_id,
                        scope.environment_id,
                        scope.session_id,
                        scope.work_id,
                        generation,
                        to_i64(expiry(now, input.ttl_ms), "expiry")?
                    ],
                )?;
                tx.commit()?;
                Ok(Issued::Token(token))
            })
            .await?;
        match issued {
            Issued::Token(token) => Ok(token),
            Issued::Superseded => Err(superseded(generation)),
        }
    }

    async fn verify(&self, token: &str) -> Result<Option<SessionTokenClaims>, PortError> {
        let Some(hash) = session_token_hash(token) else {
            return Ok(None);
        };
        self.run("session token verify", move |inner, env| {
            let row = inner
                .conn
                .prepare_cached(
                    "SELECT workspace_id, environment_id, session_id, work_id, generation,
                            expires_at_ms
                       FROM session_token
                      WHERE token_sha256 = ?1 AND revoked = 0",
                )?
                .query_row(params![hash.as_bytes().as_slice()], |row| {
                    Ok((
                        scope_at(row, 0)?,
                        row.get::<_, i64>(4)?,
                        row.get::<_, i64>(5)?,
                    ))
                })
                .optional()?;
            let Some((scope, generation, expires_at_ms)) = row else {
                return Ok(None);
            };
            let expires_at_ms = to_u64(expires_at_ms, "token expiry")?;
            if env.clock.now_ms() >= expires_at_ms {
                return Ok(None);
            }
            Ok(Some(SessionTokenClaims {
                scope,
                generation: to_u64(generation, "generation")?,
                expires_at: iso_millis(expires_at_ms),
            }))
        })
        .await
    }

    async fn revoke(&self, scope: &RuntimeResourceScope, generation: u64) -> Result<(), PortError> {
        let scope = scope.clone();
        self.run("session token revoke", move |inner, _| {
            inner.conn.execute(
                "UPDATE session_token SET revoked = 1
                  WHERE workspace_id = ?1 AND environment_id = ?2 AND session_id = ?3
                    AND work_id = ?4 AND generation = ?5",
                params![
                    scope.workspace_id,
                    scope.environment_id,
                    scope.session_id,
                    scope.work_id,
                    to_i64(generation, "generation")?
                ],
            )?;
            Ok(())
        })
        .await
    }

    async fn extend(
        &self,
        scope: &RuntimeResourceScope,
        generation: u64,
        ttl_ms: u64,
    ) -> Result<(), PortError> {
        let scope = scope.clone();
        self.run("session token extend", move |inner, env| {
            let now = env.clock.now_ms();
            inner.conn.execute(
                "UPDATE session_token SET expires_at_ms = ?7
                  WHERE workspace_id = ?1 AND environment_id = ?2 AND session_id = ?3
                    AND work_id = ?4 AND generation = ?5 AND revoked = 0
                    AND expires_at_ms > ?6",
                params![
                    scope.workspace_id,
                    scope.environment_id,
                    scope.session_id,
                    scope.work_id,
                    to_i64(generation, "generation")?,
                    to_i64(now, "time")?,
                    to_i64(expiry(now, ttl_ms), "expiry")?
                ],
            )?;
            Ok(())
        })
        .await
    }
}

#[async_trait]
impl VaultSecretPort for SqliteStore {
    async fn get(&self, name: &str) -> Result<Option<SecretString>, PortError> {
        let name = name.to_owned();
        self.run("vault get", move |inner, _| {
            let value: Option<Vec<u8>> = inner
                .conn
                .prepare_cached("SELECT value FROM vault_secret WHERE name = ?1")?
                .query_row(params![name], |row| row.get(0))
                .optional()?;
            value
                .map(|bytes| {
                    String::from_utf8(bytes)
                        .map(SecretString::new)
                        // The message names the secret, never its bytes.
                        .map_err(|_| {
                            StoreError::Corrupt(format!("vault secret {name:?} is not UTF-8"))
                        })
                })
                .transpose()
        })
        .await
    }

    async fn put(&self, name: &str, value: SecretString) -> Result<(), PortError> {
        check_vault_name(name)?;
        let name = name.to_owned();
        self.run("vault put", move |inner, env| {
            let now = to_i64(env.clock.now_ms(), "time")?;
            inner.conn.execute(
                "INSERT INTO vault_secret (name, value, created_at_ms, updated_at_ms)
                 VALUES (?1, ?2, ?3, ?3)
                 ON CONFLICT (name) DO UPDATE
                    SET value = excluded.value, updated_at_ms = excluded.updated_at_ms",
                params![name, value.expose().as_bytes(), now],
            )?;
            Ok(())
        })
        .await
    }

    async fn delete(&self, name: &str) -> Result<(), PortError> {
        let name = name.to_owned();
        self.run("vault delete", move |inner, _| {
            inner
                .conn
                .execute("DELETE FROM vault_secret WHERE name = ?1", params![name])?;
            Ok(())
        })
        .await
    }

    async fn names(&self) -> Result<Vec<String>, PortError> {
        self.run("vault names", |inner, _| {
            let mut statement = inner
                .conn
                .prepare_cached("SELECT name FROM vault_secret ORDER BY name")?;
            let names = statement
                .query_map([], |row| row.get(0))?
                .collect::<Result<Vec<String>, _>>()?;
            Ok(names)
        })
        .await
    }
}
