//! SHA-256 digests as values: the name of every blob and the id of every candidate.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::{Digest, Sha256};
use std::fmt;

/// A SHA-256 digest; displays (and serializes) as 64 lowercase hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlobHash([u8; 32]);

impl BlobHash {
    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Self {
        Self(Sha256::digest(bytes).into())
    }

    /// Parses exactly 64 lowercase hex digits; anything else is `None`.
    pub fn from_hex(text: &str) -> Option<Self> {
        if text.len() != 64 || !text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return None;
        }
        let mut out = [0u8; 32];
        hex::decode_to_slice(text, &mut out).ok()?;
        Some(Self(out))
    }

    /// Parses `sha256:<64 lowercase hex>`.
    pub fn from_content_hash(text: &str) -> Option<Self> {
        text.strip_prefix("sha256:").and_then(Self::from_hex)
    }

    /// 64 lowercase hex digits.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    /// `sha256:<hex>`, the contract's content-hash form.
    pub fn content_hash(&self) -> String {
        format!("sha256:{}", self.to_hex())
    }

    /// The raw digest.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    pub(crate) fn from_digest(digest: Sha256) -> Self {
        Self(digest.finalize().into())
    }
}

impl fmt::Display for BlobHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for BlobHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BlobHash({})", self.to_hex())
    }
}

impl Serialize for BlobHash {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.to_hex())
    }
}

impl<'de> Deserialize<'de> for BlobHash {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        BlobHash::from_hex(&text)
            .ok_or_else(|| serde::de::Error::custom("expected 64 lowercase hex digits"))
    }
}

/// First 32 hex digits of SHA-256 of `text`: the suffix of binding ids and record names.
pub(crate) fn short_hash(text: &str) -> String {
    BlobHash::of(text.as_bytes()).to_hex()[..32].to_owned()
}

/// True for `<prefix><len lowercase hex>`.
pub(crate) fn has_hex_suffix(text: &str, prefix: &str, len: usize) -> bool {
    text.strip_prefix(prefix).is_some_and(|rest| {
        rest.len() == len && rest.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_only_lowercase_hex_of_the_right_length() {
        let hash = BlobHash::of(b"abc");
        assert_eq!(
            hash.to_hex(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(BlobHash::from_hex(&hash.to_hex()), Some(hash));
        assert_eq!(BlobHash::from_hex(&hash.to_hex().to_uppercase()), None);
        assert_eq!(BlobHash::from_hex("abc"), None);
        assert_eq!(
            BlobHash::from_content_hash(&hash.content_hash()),
            Some(hash)
        );
        assert!(has_hex_suffix(
            "wsb_0123456789abcdef0123456789abcdef",
            "wsb_",
            32
        ));
        assert!(!has_hex_suffix("wsb_../", "wsb_", 32));
    }
}

/// Why a publication candidate does not name a manifest blob.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CandidateHashError {
    /// The id is not `<prefix><64 lowercase hex>`.
    InvalidId,
    /// The content hash is not `sha256:` + the id's hex.
    Mismatch,
}

/// The manifest blob a candidate names: its id is `<prefix><hex>` and its content hash
/// `sha256:<the same hex>`. Shared by workspace checkpoints (`wcp_`) and output manifests
/// (`out_`), each mapping the two failures to its own error.
pub(crate) fn candidate_manifest_hash(
    candidate: &omabox_contract::RuntimePublicationCandidate,
    prefix: &str,
) -> Result<BlobHash, CandidateHashError> {
    let hash = candidate
        .id
        .strip_prefix(prefix)
        .and_then(BlobHash::from_hex)
        .ok_or(CandidateHashError::InvalidId)?;
    if BlobHash::from_content_hash(&candidate.content_hash) != Some(hash) {
        return Err(CandidateHashError::Mismatch);
    }
    Ok(hash)
}
