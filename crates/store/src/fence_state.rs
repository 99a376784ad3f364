//! The fence state of one work item and its transitions, shared by both stores.
//!
//! Pure: no I/O, no locks, no clock. A store loads the record of a scope, applies one
//! transition with the `now` it read while holding its lock (or SQLite write transaction),
//! and writes the record back in that same critical section.
//!
//! ```text
//!              acquire: no active fence, or it expired
//!              (generation += 1, new token, expiresAt = now + ttl)
//!   ┌────────┐ ───────────────────────────────────────────────► ┌────────────────────┐
//!   │  free  │                                                   │ active (g, owner,  │
//!   │        │ ◄─────────────────────────────────────────────── │  token, expiresAt) │
//!   └────────┘   release by the same claim                       └────────────────────┘
//!                                                                  │ acquire, same owner: same fence
//!                                                                  │ acquire, other owner: conflict
//!                                                                  │ renew: expiresAt = now + ttl
//!                                                                  │ publish: revision = nextRevision++
//!                                                                  │   (identical republish: same revision)
//! ```
//!
//! An expired active fence is not cleared eagerly: it simply stops being current, and the next
//! acquire replaces it. "Current" means: this record's active fence has the caller's
//! generation, owner and token, and `expiresAt > now`.

use crate::token::TokenHash;
use omabox_contract::{
    PublishRuntimeResourcesInput, RuntimeResourceFence, RuntimeResourcePublication,
    RuntimeResourceScope, SecretString,
};

/// What a store keeps to recognise the token of the active fence.
pub trait TokenProof: Clone + Send + 'static {
    /// True when `token` is the token this proof was made from.
    fn proves(&self, token: &SecretString) -> bool;
}

/// The in-memory store keeps the token itself.
impl TokenProof for SecretString {
    fn proves(&self, token: &SecretString) -> bool {
        self == token
    }
}

/// The SQLite store keeps only the token's hash.
impl TokenProof for TokenHash {
    fn proves(&self, token: &SecretString) -> bool {
        TokenHash::of(token) == *self
    }
}

/// Everything a store knows about one work item (`{generation, active, publication,
/// nextRevision}` of the reference).
#[derive(Debug, Clone, PartialEq)]
pub struct FenceRecord<P> {
    /// The latest generation handed out (0 before the first acquire).
    pub generation: u64,
    /// The fence last handed out, unless released. It may have expired.
    pub active: Option<ActiveFence<P>>,
    /// The authoritative active pointer, possibly from an earlier generation.
    pub publication: Option<RuntimeResourcePublication>,
    /// The revision the next non-idempotent publish gets.
    pub next_revision: u64,
}

/// The fence last handed out for a work item.
#[derive(Debug, Clone, PartialEq)]
pub struct ActiveFence<P> {
    /// Who holds it.
    pub owner_id: String,
    /// Its generation (always the record's latest).
    pub generation: u64,
    /// The token, or what proves it.
    pub proof: P,
    /// Expiry, milliseconds since the epoch.
    pub expires_at_ms: u64,
}

impl<P> ActiveFence<P> {
    /// The contract fence for this claim, given its token.
    pub(crate) fn to_fence(
        &self,
        scope: &RuntimeResourceScope,
        token: SecretString,
    ) -> RuntimeResourceFence {
        RuntimeResourceFence {
            workspace_id: scope.workspace_id.clone(),
            environment_id: scope.environment_id.clone(),
            session_id: scope.session_id.clone(),
            work_id: scope.work_id.clone(),
            owner_id: self.owner_id.clone(),
            generation: self.generation,
            token,
            expires_at: crate::clock::iso_millis(self.expires_at_ms),
        }
    }
}

/// Outcome of [`FenceRecord::acquire`].
#[derive(Debug)]
pub(crate) enum AcquireStep<P> {
    /// The same owner holds an unexpired fence: hand back that fence. Nothing changed.
    Reentrant(ActiveFence<P>),
    /// Another owner holds an unexpired fence. Nothing changed.
    Conflict {
        /// When the other owner's fence expires.
        expires_at_ms: u64,
    },
    /// A new generation was claimed and is now the active fence.
    Claimed(ActiveFence<P>),
}

impl<P: TokenProof> Default for FenceRecord<P> {
    fn default() -> Self {
        Self {
            generation: 0,
            active: None,
            publication: None,
            next_revision: 1,
        }
    }
}

impl<P: TokenProof> FenceRecord<P> {
    /// Claims the work item for `owner_id`. `proof_for(generation)` is called only when a new
    /// generation is claimed.
    pub(crate) fn acquire(
        &mut self,
        owner_id: &str,
        ttl_ms: u64,
        now_ms: u64,
        proof_for: impl FnOnce(u64) -> P,
    ) -> AcquireStep<P> {
        if let Some(active) = &self.active
            && active.expires_at_ms > now_ms
        {
            return if active.owner_id == owner_id {
                AcquireStep::Reentrant(active.clone())
            } else {
                AcquireStep::Conflict {
                    expires_at_ms: active.expires_at_ms,
                }
            };
        }
        self.generation = self.generation.saturating_add(1);
        let active = ActiveFence {
            owner_id: owner_id.to_owned(),
            generation: self.generation,
            proof: proof_for(self.generation),
            expires_at_ms: crate::clock::expiry(now_ms, ttl_ms),
        };
        self.active = Some(active.clone());
        AcquireStep::Claimed(active)
    }

    /// The active fence, if `fence` is the same claim (owner, generation, token); expiry is
    /// not considered.
    fn same_claim(&self, fence: &RuntimeResourceFence) -> Option<&ActiveFence<P>> {
        self.active.as_ref().filter(|active| {
            active.generation == fence.generation
                && active.owner_id == fence.owner_id
                && active.proof.proves(&fence.token)
        })
    }

    /// True when `generation` still holds the work item: it is the active fence's generation
    /// and that fence has not expired. The lease journal's "not abandoned"; no token needed.
    pub(crate) fn held_by(&self, generation: u64, now_ms: u64) -> bool {
        self.active
            .as_ref()
            .is_some_and(|active| active.generation == generation && active.expires_at_ms > now_ms)
    }

    /// True when `fence` is this record's active, unexpired fence.
    pub(crate) fn is_current(&self, fence: &RuntimeResourceFence, now_ms: u64) -> bool {
        self.same_claim(fence)
            .is_some_and(|active| active.expires_at_ms > now_ms)
    }

    /// Extends a current fence to `now + ttl`; `None` when it is not current.
    pub(crate) fn renew(
        &mut self,
        fence: &RuntimeResourceFence,
        ttl_ms: u64,
        now_ms: u64,
    ) -> Option<ActiveFence<P>> {
        if !self.is_current(fence, now_ms) {
            return None;
        }
        let active = self.active.as_mut()?;
        active.expires_at_ms = crate::clock::expiry(now_ms, ttl_ms);
        Some(active.clone())
    }

    /// Publishes for a current fence and returns the revision; `None` when it is not current.
    ///
    /// An identical republish by the same generation returns the existing revision and
    /// changes nothing. `changed` tells the caller whether the record must be written back.
    pub(crate) fn publish(
        &mut self,
        input: &PublishRuntimeResourcesInput,
        now_ms: u64,
    ) -> Option<Published> {
        if !self.is_current(&input.fence, now_ms) {
            return None;
        }
        if let Some(existing) = &self.publication
            && is_identical_republish(existing, input)
        {
            return Some(Published {
                revision: existing.revision,
                changed: false,
            });
        }
        let revision = self.next_revision;
        self.next_revision = self.next_revision.saturating_add(1);
        self.publication = Some(RuntimeResourcePublication {
            generation: input.fence.generation,
            revision,
            workspace_candidate: input.workspace_candidate.clone(),
            output_candidate: input.output_candidate.clone(),
            // Kept exactly as supplied: absent stays absent, null stays null.
            runtime_checkpoint: input.runtime_checkpoint.clone(),
        });
        Some(Published {
            revision,
            changed: true,
        })
    }

    /// Clears the active fence if `fence` is the same claim (expired or not). Returns whether
    /// anything changed; a stale fence changes nothing.
    pub(crate) fn release(&mut self, fence: &RuntimeResourceFence) -> bool {
        if self.same_claim(fence).is_none() {
            return false;
        }
        self.active = None;
        true
    }
}

/// Outcome of a successful [`FenceRecord::publish`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Published {
    pub(crate) revision: u64,
    pub(crate) changed: bool,
}

/// Same generation, same workspace candidate (id + contentHash), same output candidate (both
/// none, or id + contentHash equal) and the same runtime checkpoint (absent ≡ null).
/// Candidate metadata is not compared, as in the reference.
fn is_identical_republish(
    existing: &RuntimeResourcePublication,
    input: &PublishRuntimeResourcesInput,
) -> bool {
    let same_output = match (&existing.output_candidate, &input.output_candidate) {
        (None, None) => true,
        (Some(existing), Some(candidate)) => existing.same_content(candidate),
        _ => false,
    };
    existing.generation == input.fence.generation
        && existing
            .workspace_candidate
            .same_content(&input.workspace_candidate)
        && same_output
        && existing.runtime_checkpoint.as_option() == input.runtime_checkpoint.as_option()
}

#[cfg(test)]
mod tests {
    use super::*;
    use omabox_contract::{
        Nullable, RuntimeCheckpointKind, RuntimeCheckpointRef, RuntimePublicationCandidate,
    };

    fn scope() -> RuntimeResourceScope {
        RuntimeResourceScope::new("w", "e", "s", "k")
    }

    fn claim(
        record: &mut FenceRecord<SecretString>,
        owner: &str,
        now: u64,
    ) -> RuntimeResourceFence {
        match record.acquire(owner, 100, now, |generation| {
            SecretString::new(format!("{owner}-{generation}"))
        }) {
            AcquireStep::Claimed(active) | AcquireStep::Reentrant(active) => {
                let token = active.proof.clone();
                active.to_fence(&scope(), token)
            }
            AcquireStep::Conflict { .. } => panic!("unexpected conflict"),
        }
    }

    fn candidate(id: &str, hash: &str) -> RuntimePublicationCandidate {
        RuntimePublicationCandidate {
            id: id.into(),
            content_hash: hash.into(),
            metadata: None,
        }
    }

    fn checkpoint() -> RuntimeCheckpointRef {
        RuntimeCheckpointRef {
            provider: "p".into(),
            checkpoint_id: "c".into(),
            kind: RuntimeCheckpointKind::Filesystem,
            source_runtime_id: "r".into(),
            session_id: "s".into(),
            work_generation: 1,
            workspace_revision: 1,
            harness_version: "v".into(),
            runtime_identity: "{}".into(),
        }
    }

    #[test]
    fn identical_republish_treats_absent_and_null_checkpoint_alike() {
        let mut record = FenceRecord::default();
        let fence = claim(&mut record, "a", 0);
        let input = |checkpoint: Nullable<RuntimeCheckpointRef>| PublishRuntimeResourcesInput {
            fence: fence.clone(),
            workspace_candidate: candidate("ws", "h"),
            output_candidate: None,
            runtime_checkpoint: checkpoint,
        };
        let first = record.publish(&input(Nullable::Absent), 1).unwrap();
        assert_eq!((first.revision, first.changed), (1, true));
        let again = record.publish(&input(Nullable::Null), 1).unwrap();
        assert_eq!((again.revision, again.changed), (1, false));
        // The stored publication keeps what the first publish supplied.
        assert!(
            record
                .publication
                .as_ref()
                .unwrap()
                .runtime_checkpoint
                .is_absent()
        );
        let with_checkpoint = record
            .publish(&input(Nullable::Value(checkpoint())), 1)
            .unwrap();
        assert_eq!(
            (with_checkpoint.revision, with_checkpoint.changed),
            (2, true)
        );
    }

    #[test]
    fn metadata_does_not_break_idempotency_but_output_presence_does() {
        let mut record = FenceRecord::default();
        let fence = claim(&mut record, "a", 0);
        let mut input = PublishRuntimeResourcesInput {
            fence,
            workspace_candidate: candidate("ws", "h"),
            output_candidate: None,
            runtime_checkpoint: Nullable::Absent,
        };
        assert_eq!(record.publish(&input, 1).unwrap().revision, 1);
        input.workspace_candidate.metadata = Some([("k".to_owned(), "v".into())].into());
        assert_eq!(record.publish(&input, 1).unwrap().revision, 1);
        input.output_candidate = Some(candidate("out", "o"));
        assert_eq!(record.publish(&input, 1).unwrap().revision, 2);
        input.output_candidate = Some(candidate("out", "o2"));
        assert_eq!(record.publish(&input, 1).unwrap().revision, 3);
    }

    #[test]
    fn expiry_is_strict() {
        let mut record = FenceRecord::default();
        let fence = claim(&mut record, "a", 0);
        assert!(record.is_current(&fence, 99));
        assert!(!record.is_current(&fence, 100));
        // At the expiry instant another owner may take over.
        let next = claim(&mut record, "b", 100);
        assert_eq!(next.generation, 2);
    }
}
