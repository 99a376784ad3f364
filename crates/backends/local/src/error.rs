//! Errors of the local-subprocess sandbox.

use omabox_contract::PortError;
use std::path::PathBuf;

/// Why a local-subprocess operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LocalSandboxError {
    /// The factory was called outside test mode.
    #[error(
        "the local-subprocess sandbox has no isolation boundary and is created only in test \
         mode (set OMABOX_TEST_MODE=1 or NODE_ENV=test)"
    )]
    NotTestMode,
    /// A path that is malformed (NUL byte).
    #[error("invalid sandbox path {path:?}: {reason}")]
    InvalidPath {
        /// The sandbox path.
        path: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// An absolute path outside the mapped roots.
    #[error(
        "sandbox path {path:?} is outside the local sandbox's file roots (/workspace, \
         /mnt/session/outputs, or a path relative to /workspace)"
    )]
    OutsideRoots {
        /// The sandbox path.
        path: String,
    },
    /// A path that leaves its root through `..` or a symlink.
    #[error("sandbox path {path:?} escapes its root {root}")]
    Escapes {
        /// The sandbox path.
        path: String,
        /// The sandbox root it had to stay in.
        root: &'static str,
    },
    /// `/mnt/session/outputs` without an outputs root.
    #[error(
        "sandbox path {path:?} is under /mnt/session/outputs, but this sandbox has no outputs \
         root configured"
    )]
    OutputsNotMounted {
        /// The sandbox path.
        path: String,
    },
    /// The sandbox was destroyed.
    #[error("the local-subprocess sandbox was destroyed")]
    Destroyed,
    /// A filesystem operation failed.
    #[error("{operation} {path:?} failed")]
    Io {
        /// What was attempted.
        operation: &'static str,
        /// The sandbox path (or host path for setup).
        path: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A process could not be started.
    #[error("could not start {command:?}")]
    Spawn {
        /// The command.
        command: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The workdir or outputs root could not be prepared.
    #[error("could not prepare sandbox directory {path}")]
    Setup {
        /// The host directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A command outlived its timeout and did not release its output pipes after `SIGKILL`
    /// (a descendant left the process group).
    #[error(
        "command {command:?} timed out and its output pipes stayed open after SIGKILL (a \
         descendant left the process group)"
    )]
    Unkillable {
        /// The command.
        command: String,
    },
}

impl From<LocalSandboxError> for PortError {
    /// The message with its whole source chain, since a `PortError` carries text only.
    fn from(error: LocalSandboxError) -> Self {
        let mut message = error.to_string();
        let mut source = std::error::Error::source(&error);
        while let Some(cause) = source {
            message.push_str(": ");
            message.push_str(&cause.to_string());
            source = cause.source();
        }
        match error {
            LocalSandboxError::InvalidPath { .. }
            | LocalSandboxError::OutsideRoots { .. }
            | LocalSandboxError::Escapes { .. }
            | LocalSandboxError::OutputsNotMounted { .. } => PortError::invalid_argument(message),
            _ => PortError::new(message),
        }
    }
}
