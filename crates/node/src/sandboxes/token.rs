//! Sandbox ids and access tokens: E2B-style ids (20 lowercase letters and digits) and
//! tokens of 32 random bytes, compared in constant time.
//!
//! Must never: compare a token with an early exit; show one in `Debug`.

use omabox_contract::SecretString;
use sha2::{Digest as _, Sha256};

/// Characters of a sandbox id.
const ID_ALPHABET: &[u8; 36] = b"abcdefghijklmnopqrstuvwxyz0123456789";
/// Length of a sandbox id.
const ID_LEN: usize = 20;

/// A new sandbox id: 20 characters of `[a-z0-9]`, from the OS's random generator.
pub fn new_sandbox_id() -> String {
    let bytes: [u8; ID_LEN] = rand::random();
    bytes
        .iter()
        .map(|b| char::from(ID_ALPHABET[usize::from(*b) % ID_ALPHABET.len()]))
        .collect()
}

/// A new access token: 32 random bytes, hex.
pub fn new_access_token() -> SecretString {
    let bytes: [u8; 32] = rand::random();
    SecretString::new(hex::encode(bytes))
}

/// Whether `presented` is `expected`, in time independent of where they differ: both
/// are hashed to 32 bytes and every byte is compared.
pub fn tokens_match(expected: &str, presented: &str) -> bool {
    let (a, b) = (
        Sha256::digest(expected.as_bytes()),
        Sha256::digest(presented.as_bytes()),
    );
    let difference = a
        .iter()
        .zip(b.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(difference) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_tokens_have_their_shapes_and_differ() {
        let id = new_sandbox_id();
        assert_eq!(id.len(), 20);
        assert!(id.bytes().all(|b| ID_ALPHABET.contains(&b)));
        assert_ne!(id, new_sandbox_id());
        let token = new_access_token();
        assert_eq!(token.expose().len(), 64);
        assert_ne!(token.expose(), new_access_token().expose());
        assert!(!format!("{token:?}").contains(token.expose()));
    }

    #[test]
    fn tokens_match_only_themselves() {
        let token = new_access_token();
        assert!(tokens_match(token.expose(), token.expose()));
        assert!(!tokens_match(token.expose(), ""));
        assert!(!tokens_match(token.expose(), &token.expose()[..63]));
        let mut other = token.expose().to_owned();
        other.replace_range(63.., if other.ends_with('0') { "1" } else { "0" });
        assert!(!tokens_match(token.expose(), &other));
    }
}
