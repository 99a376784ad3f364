//! The one error type every port returns.
//!
//! The TypeScript contract throws plain `Error`s (and a few subclasses) whose *messages* are
//! part of the observable contract: tests match on them. [`PortError`] keeps that shape: a
//! message that is the contract's exact text, and a [`ErrorKind`] naming the TypeScript class
//! it corresponds to, so callers can tell an admission failure from a provider failure without
//! parsing text.

use serde::{Deserialize, Serialize};

/// Which TypeScript error class an error corresponds to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A plain `Error`: a step failed.
    #[serde(rename = "Error")]
    Failure,
    /// `ManagedRuntimeCapabilityError`: a profile cannot be admitted against capabilities.
    #[serde(rename = "ManagedRuntimeCapabilityError")]
    Capability,
    /// `TypeError`: a caller passed a value of the wrong shape (empty id, bad module).
    #[serde(rename = "TypeError")]
    InvalidArgument,
    /// `RangeError`: a numeric option outside its range.
    #[serde(rename = "RangeError")]
    Range,
    /// `SupervisorProtocolError`: the supervised harness broke its protocol.
    #[serde(rename = "SupervisorProtocolError")]
    SupervisorProtocol,
    /// A cancellation without a more specific reason (JS `AbortError`).
    #[serde(rename = "AbortError")]
    Aborted,
}

impl ErrorKind {
    /// The TypeScript class name (the `name` field of the thrown error).
    pub fn class_name(self) -> &'static str {
        match self {
            ErrorKind::Failure => "Error",
            ErrorKind::Capability => "ManagedRuntimeCapabilityError",
            ErrorKind::InvalidArgument => "TypeError",
            ErrorKind::Range => "RangeError",
            ErrorKind::SupervisorProtocol => "SupervisorProtocolError",
            ErrorKind::Aborted => "AbortError",
        }
    }
}

/// An error from a port or from the host, carrying the contract's exact message.
///
/// Serializes as `{"name": "<class>", "message": "<text>"}`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[error("{message}")]
pub struct PortError {
    #[serde(rename = "name")]
    kind: ErrorKind,
    message: String,
}

impl PortError {
    /// A plain failure (`Error`).
    pub fn new(message: impl Into<String>) -> Self {
        Self::with_kind(ErrorKind::Failure, message)
    }

    /// A capability/admission failure (`ManagedRuntimeCapabilityError`).
    pub fn capability(message: impl Into<String>) -> Self {
        Self::with_kind(ErrorKind::Capability, message)
    }

    /// A malformed argument (`TypeError`).
    pub fn invalid_argument(message: impl Into<String>) -> Self {
        Self::with_kind(ErrorKind::InvalidArgument, message)
    }

    /// A numeric option out of range (`RangeError`).
    pub fn range(message: impl Into<String>) -> Self {
        Self::with_kind(ErrorKind::Range, message)
    }

    /// A supervised-harness protocol violation (`SupervisorProtocolError`).
    pub fn supervisor_protocol(message: impl Into<String>) -> Self {
        Self::with_kind(ErrorKind::SupervisorProtocol, message)
    }

    /// A cancellation with no more specific reason.
    pub fn aborted() -> Self {
        Self::with_kind(ErrorKind::Aborted, "This operation was aborted")
    }

    /// An error of an explicit kind.
    pub fn with_kind(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }

    /// Which TypeScript class this error corresponds to.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The message text (the contract's exact wording where it fixes one).
    pub fn message(&self) -> &str {
        &self.message
    }

    /// This error with every occurrence of `secret` replaced by `"[redacted]"`.
    ///
    /// Used before an error is persisted (orphan records) or printed. An empty secret
    /// leaves the text unchanged.
    pub fn redacted(&self, secret: &str) -> Self {
        if secret.is_empty() {
            return self.clone();
        }
        Self {
            kind: self.kind,
            message: self.message.replace(secret, "[redacted]"),
        }
    }
}

impl From<std::io::Error> for PortError {
    fn from(error: std::io::Error) -> Self {
        PortError::new(error.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redaction_replaces_every_occurrence() {
        let error = PortError::new("token abc leaked twice: abc");
        assert_eq!(
            error.redacted("abc").message(),
            "token [redacted] leaked twice: [redacted]"
        );
        assert_eq!(error.redacted("").message(), error.message());
    }

    #[test]
    fn serializes_with_the_typescript_class_name() {
        let json = serde_json::to_string(&PortError::capability("nope")).unwrap();
        assert_eq!(
            json,
            r#"{"name":"ManagedRuntimeCapabilityError","message":"nope"}"#
        );
    }
}
