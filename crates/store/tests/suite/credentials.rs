//! Session tokens and the vault (omabox extensions), run against every store.

use super::{Subject, T0, scope};
use omabox_contract::{IssueSessionTokenInput, RuntimeResourceScope, SecretString};
use omabox_store::{SESSION_TOKEN_LEN, iso_millis};

const TOKEN_TTL: u64 = 10_000;

impl Subject {
    async fn issue(&self, scope: RuntimeResourceScope, generation: u64) -> SecretString {
        self.tokens
            .issue(IssueSessionTokenInput {
                scope,
                generation,
                ttl_ms: TOKEN_TTL,
            })
            .await
            .unwrap()
    }

    /// The (scope, generation) a token verifies to, if it does.
    async fn claim_of(&self, token: &SecretString) -> Option<(RuntimeResourceScope, u64)> {
        self.tokens
            .verify(token.expose())
            .await
            .unwrap()
            .map(|claims| (claims.scope, claims.generation))
    }
}

fn other_scope() -> RuntimeResourceScope {
    RuntimeResourceScope::new("workspace", "environment", "session", "other-work")
}

// ---- session tokens ------------------------------------------------------------------------

pub async fn session_tokens_issue_verify_and_revoke(s: Subject) {
    let token = s.issue(scope(), 1).await;
    assert!(token.expose().starts_with("omst_"));
    assert_eq!(token.expose().len(), SESSION_TOKEN_LEN);
    let claims = s.tokens.verify(token.expose()).await.unwrap().unwrap();
    assert_eq!(claims.scope, scope());
    assert_eq!(claims.generation, 1);
    assert_eq!(claims.expires_at, iso_millis(T0 + TOKEN_TTL));

    // A second token for the same claim (re-entrant acquire) is distinct and also live.
    let again = s.issue(scope(), 1).await;
    assert_ne!(again, token);
    assert_eq!(s.claim_of(&again).await, Some((scope(), 1)));
    // Another work item is independent.
    let other = s.issue(other_scope(), 1).await;

    s.tokens.revoke(&scope(), 1).await.unwrap();
    assert_eq!(s.claim_of(&token).await, None);
    assert_eq!(s.claim_of(&again).await, None);
    assert_eq!(s.claim_of(&other).await, Some((other_scope(), 1)));
    // Idempotent, and a never-issued claim is a no-op.
    s.tokens.revoke(&scope(), 1).await.unwrap();
    s.tokens.revoke(&scope(), 9).await.unwrap();
    assert_eq!(s.claim_of(&other).await, Some((other_scope(), 1)));
}

pub async fn a_new_generation_rotates_the_work_items_tokens(s: Subject) {
    let first = s.issue(scope(), 1).await;
    let other = s.issue(other_scope(), 1).await;
    let second = s.issue(scope(), 2).await;
    assert_eq!(s.claim_of(&first).await, None, "rotated out on reclaim");
    assert_eq!(s.claim_of(&second).await, Some((scope(), 2)));
    assert_eq!(s.claim_of(&other).await, Some((other_scope(), 1)));
    // Generations may skip (a claim that never issued); still rotates.
    let fifth = s.issue(scope(), 5).await;
    assert_eq!(s.claim_of(&second).await, None);
    assert_eq!(s.claim_of(&fifth).await, Some((scope(), 5)));
    // Revoking an old generation leaves the current one alone.
    s.tokens.revoke(&scope(), 2).await.unwrap();
    assert_eq!(s.claim_of(&fifth).await, Some((scope(), 5)));
}

pub async fn a_superseded_generation_cannot_issue(s: Subject) {
    let current = s.issue(scope(), 3).await;
    let error = s
        .tokens
        .issue(IssueSessionTokenInput {
            scope: scope(),
            generation: 2,
            ttl_ms: TOKEN_TTL,
        })
        .await
        .unwrap_err();
    assert!(error.to_string().contains("newer generation"), "{error}");
    assert_eq!(s.claim_of(&current).await, Some((scope(), 3)));
}

pub async fn extend_moves_the_expiry_of_live_tokens_only(s: Subject) {
    let token = s.issue(scope(), 1).await;
    let other = s.issue(other_scope(), 1).await;
    s.clock.advance(TOKEN_TTL - 1);
    // The fence was renewed for 3 × TTL: the claim's token now lives exactly as long.
    s.tokens.extend(&scope(), 1, 3 * TOKEN_TTL).await.unwrap();
    let claims = s.tokens.verify(token.expose()).await.unwrap().unwrap();
    assert_eq!(
        claims.expires_at,
        iso_millis(T0 + TOKEN_TTL - 1 + 3 * TOKEN_TTL)
    );
    s.clock.advance(1);
    assert_eq!(s.claim_of(&token).await, Some((scope(), 1)), "extended");
    assert_eq!(s.claim_of(&other).await, None, "another claim is untouched");
    // Another generation of the same work item is untouched.
    s.tokens.extend(&scope(), 2, 10 * TOKEN_TTL).await.unwrap();
    s.clock.advance(3 * TOKEN_TTL - 1);
    assert_eq!(
        s.claim_of(&token).await,
        None,
        "expires with the renewed fence"
    );
    // Neither an expired nor a revoked token comes back.
    s.tokens.extend(&scope(), 1, TOKEN_TTL).await.unwrap();
    s.tokens.extend(&other_scope(), 1, TOKEN_TTL).await.unwrap();
    assert_eq!(s.claim_of(&token).await, None);
    assert_eq!(s.claim_of(&other).await, None);
    let fresh = s.issue(other_scope(), 2).await;
    s.tokens.revoke(&other_scope(), 2).await.unwrap();
    s.tokens.extend(&other_scope(), 2, TOKEN_TTL).await.unwrap();
    assert_eq!(s.claim_of(&fresh).await, None);
}

pub async fn session_tokens_expire_by_the_clock(s: Subject) {
    let token = s.issue(scope(), 1).await;
    s.clock.advance(TOKEN_TTL - 1);
    assert_eq!(s.claim_of(&token).await, Some((scope(), 1)));
    s.clock.advance(1);
    assert_eq!(s.claim_of(&token).await, None, "expired at expiresAt");
    // Expired rows are pruned on the next issue; the new token is unaffected.
    let next = s.issue(scope(), 2).await;
    assert_eq!(s.claim_of(&next).await, Some((scope(), 2)));
    assert_eq!(s.claim_of(&token).await, None);
    // A zero TTL issues a token that is already expired.
    let dead = s
        .tokens
        .issue(IssueSessionTokenInput {
            scope: other_scope(),
            generation: 1,
            ttl_ms: 0,
        })
        .await
        .unwrap();
    assert_eq!(s.claim_of(&dead).await, None);
}

pub async fn garbage_tokens_do_not_verify(s: Subject) {
    let token = s.issue(scope(), 1).await;
    let live = token.expose();
    let mut flipped = live.as_bytes().to_vec();
    let last = flipped.len() - 1;
    flipped[last] = if flipped[last] == b'A' { b'B' } else { b'A' };
    let flipped = String::from_utf8(flipped).unwrap();
    for garbage in [
        "",
        " ",
        "omst_",
        "Bearer x",
        &live[..live.len() - 1],
        &format!("{live} "),
        &format!(" {live}"),
        &live.to_uppercase(),
        &flipped,
        &format!("omst_{}", "A".repeat(43)),
    ] {
        assert_eq!(
            s.tokens.verify(garbage).await.unwrap(),
            None,
            "{garbage:?} must not verify"
        );
    }
    assert_eq!(s.claim_of(&token).await, Some((scope(), 1)));
}

// ---- vault ---------------------------------------------------------------------------------

pub async fn vault_puts_gets_replaces_deletes_and_lists_names(s: Subject) {
    let v = &s.vault;
    assert_eq!(v.get("mcp/github").await.unwrap(), None);
    assert!(v.names().await.unwrap().is_empty());
    v.put("mcp/github", SecretString::new("ghp_first"))
        .await
        .unwrap();
    v.put("egress/npm", SecretString::new("npm_token ünïcode"))
        .await
        .unwrap();
    assert_eq!(
        v.get("mcp/github").await.unwrap(),
        Some(SecretString::new("ghp_first"))
    );
    v.put("mcp/github", SecretString::new("ghp_second"))
        .await
        .unwrap();
    assert_eq!(
        v.get("mcp/github").await.unwrap().unwrap().expose(),
        "ghp_second"
    );
    assert_eq!(
        v.get("egress/npm").await.unwrap().unwrap().expose(),
        "npm_token ünïcode"
    );
    assert_eq!(v.names().await.unwrap(), ["egress/npm", "mcp/github"]);
    // An empty value is a value.
    v.put("empty", SecretString::new("")).await.unwrap();
    assert_eq!(v.get("empty").await.unwrap(), Some(SecretString::new("")));

    v.delete("mcp/github").await.unwrap();
    v.delete("mcp/github").await.unwrap();
    v.delete("never").await.unwrap();
    assert_eq!(v.get("mcp/github").await.unwrap(), None);
    assert_eq!(v.names().await.unwrap(), ["egress/npm", "empty"]);
}

pub async fn vault_errors_never_carry_a_value(s: Subject) {
    let value = "vault-value-7f3a9c";
    let error = s.vault.put("", SecretString::new(value)).await.unwrap_err();
    let text = format!("{error} {error:?}");
    assert!(text.contains("name"), "{text}");
    assert!(!text.contains(value), "{text}");
    assert!(s.vault.names().await.unwrap().is_empty());
}
