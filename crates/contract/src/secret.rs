//! A string that must never be printed.

use serde::{Deserialize, Serialize};
use std::fmt;

/// An opaque secret (a fence token, a session token).
///
/// `Debug` and `Display` print `[redacted]`; the value is reachable only through
/// [`SecretString::expose`], so every place that reads it is greppable. It serializes
/// transparently because a fence crossing a wire (a remote fence service) must carry it;
/// types that are persisted (leases, checkpoints, orphan records) simply have no field for it.
#[derive(Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SecretString(String);

impl SecretString {
    /// Wraps a secret value.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The secret value. Never log or persist what this returns.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for SecretString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

impl fmt::Display for SecretString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_and_display_never_show_the_value() {
        let secret = SecretString::new("fence-secret");
        assert_eq!(format!("{secret:?} {secret}"), "[redacted] [redacted]");
        assert_eq!(secret.expose(), "fence-secret");
    }
}
