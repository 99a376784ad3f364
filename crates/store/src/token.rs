//! Fence tokens: issued from a CSPRNG, known only to the process that acquired the fence, and
//! persisted only as a SHA-256 hash.

use omabox_contract::SecretString;
use rand::Rng as _;
use sha2::{Digest, Sha256};
use std::fmt;

/// Issues the token of a new fence generation.
///
/// Any `Fn(u64) -> String` closure is a token source (the argument is the generation), which
/// lets tests use predictable tokens. A real store must use [`RandomTokens`]: the token is the
/// only proof of ownership, so it must be unguessable.
pub trait TokenSource: Send + Sync {
    /// A fresh token for `generation`.
    fn issue(&self, generation: u64) -> SecretString;
}

impl<F> TokenSource for F
where
    F: Fn(u64) -> String + Send + Sync,
{
    fn issue(&self, generation: u64) -> SecretString {
        SecretString::new(self(generation))
    }
}

/// The default token source: `"<generation>:<32 hex digits>"`, 128 bits from the thread-local
/// CSPRNG (ChaCha, seeded and periodically reseeded from the operating system).
///
/// The reference implementation uses `"<generation>:<random uuid>"`; the shape is the same
/// (a generation prefix and an unguessable suffix), and callers treat it as opaque.
#[derive(Debug, Clone, Copy, Default)]
pub struct RandomTokens;

impl TokenSource for RandomTokens {
    fn issue(&self, generation: u64) -> SecretString {
        let mut random = [0_u8; 16];
        rand::rng().fill_bytes(&mut random);
        SecretString::new(format!("{generation}:{}", hex::encode(random)))
    }
}

/// SHA-256 of a fence token: what the SQLite store keeps instead of the token.
///
/// No salt or key stretching is needed: a token carries 128 random bits, so the hash cannot
/// be inverted by guessing. Comparing hashes instead of tokens also means a timing difference
/// reveals nothing about the token.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct TokenHash(pub(crate) [u8; 32]);

impl TokenHash {
    /// The hash of `token`.
    pub fn of(token: &SecretString) -> Self {
        Self(Sha256::digest(token.expose().as_bytes()).into())
    }

    /// The 32 hash bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl fmt::Debug for TokenHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TokenHash({})", hex::encode(self.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_tokens_carry_the_generation_and_128_random_bits() {
        let first = RandomTokens.issue(7);
        let second = RandomTokens.issue(7);
        let (generation, random) = first.expose().split_once(':').unwrap();
        assert_eq!(generation, "7");
        assert_eq!(random.len(), 32);
        assert!(random.bytes().all(|byte| byte.is_ascii_hexdigit()));
        assert_ne!(first, second);
    }

    #[test]
    fn closures_are_token_sources() {
        let source = |generation: u64| format!("token-{generation}");
        assert_eq!(source.issue(3).expose(), "token-3");
    }

    #[test]
    fn hash_is_sha256_of_the_token_text() {
        let hash = TokenHash::of(&SecretString::new("abc"));
        assert_eq!(
            hex::encode(hash.as_bytes()),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
