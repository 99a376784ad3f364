//! Session tokens: the short-lived bearer a claimed work item's harness presents to the
//! hosted inference proxy and the MCP proxy (`HOSTED_INFERENCE_TOKEN`, the Work
//! `sessions_token`).
//!
//! A token is `omst_` followed by 256 bits from the thread-local CSPRNG in unpadded base64url
//! (43 characters, 48 in all). The fixed prefix makes a leaked token recognisable to secret
//! scanners. Stores keep only its SHA-256 ([`TokenHash`]), so reading the database (or its
//! WAL) never yields a live token; 256 random bits make the unsalted hash uninvertible.
//!
//! Must never: put a token into an error text, a log field or a `Debug` rendering; the only
//! way to read one is [`SecretString::expose`].

use crate::token::TokenHash;
use omabox_contract::SecretString;
use rand::Rng as _;

/// The prefix of every session token.
pub const SESSION_TOKEN_PREFIX: &str = "omst_";

/// Length of a session token: the prefix and 43 base64url characters (32 bytes, unpadded).
pub const SESSION_TOKEN_LEN: usize = SESSION_TOKEN_PREFIX.len() + 43;

const BASE64URL: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/// A fresh session token (see the module doc for its shape).
pub fn new_session_token() -> SecretString {
    let mut random = [0_u8; 32];
    rand::rng().fill_bytes(&mut random);
    SecretString::new(format!("{SESSION_TOKEN_PREFIX}{}", base64url(&random)))
}

/// The hash a store keeps for `token`, or `None` when `token` cannot be a session token (so a
/// store answers garbage without a lookup).
pub fn session_token_hash(token: &str) -> Option<TokenHash> {
    let body = token.strip_prefix(SESSION_TOKEN_PREFIX)?;
    let well_formed =
        token.len() == SESSION_TOKEN_LEN && body.bytes().all(|byte| BASE64URL.contains(&byte));
    well_formed.then(|| TokenHash::of(&SecretString::new(token)))
}

/// RFC 4648 §5 base64url without padding.
fn base64url(bytes: &[u8]) -> String {
    let mut text = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        // A chunk of k bytes yields k + 1 characters.
        for i in 0..=chunk.len() {
            let index = (n >> (18 - 6 * i)) & 0x3f;
            text.push(char::from(BASE64URL[index as usize]));
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64url_matches_rfc_4648_vectors() {
        let cases: [(&[u8], &str); 7] = [
            (b"", ""),
            (b"f", "Zg"),
            (b"fo", "Zm8"),
            (b"foo", "Zm9v"),
            (b"foob", "Zm9vYg"),
            (b"fooba", "Zm9vYmE"),
            (&[0xfb, 0xff, 0xbf], "-_-_"),
        ];
        for (input, expected) in cases {
            assert_eq!(base64url(input), expected);
        }
    }

    #[test]
    fn tokens_are_prefixed_unique_and_well_formed() {
        let first = new_session_token();
        let second = new_session_token();
        assert_ne!(first, second);
        assert_eq!(first.expose().len(), SESSION_TOKEN_LEN);
        assert!(first.expose().starts_with("omst_"));
        assert!(session_token_hash(first.expose()).is_some());
        assert_eq!(
            session_token_hash(first.expose()),
            Some(TokenHash::of(&first))
        );
    }

    #[test]
    fn garbage_has_no_hash() {
        let token = new_session_token();
        let token = token.expose();
        for garbage in [
            "",
            "omst_",
            "Bearer x",
            &token[1..],
            &format!("{token}A"),
            &format!("omst_{}", "!".repeat(43)),
            &format!("omst_{}", "é".repeat(21)),
        ] {
            assert_eq!(session_token_hash(garbage), None, "{garbage:?}");
        }
    }
}
