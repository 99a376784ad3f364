//! [`DockerError`]: why an operation of the docker backend failed. Must never carry an
//! environment value or a registry credential; text the container controls (its stderr)
//! is capped and escaped before it is put in one.

use std::error::Error as StdError;
use std::fmt::Write as _;
use std::time::Duration;

use omabox_agent::client::ClientError;
use omabox_agent::message::ErrorKind;
use omabox_contract::PortError;

/// Why an operation of the docker backend failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DockerError {
    /// The engine did not answer at its address.
    #[error("could not reach the Docker Engine at {host}")]
    Reach {
        /// `DOCKER_HOST`, or the default socket.
        host: String,
        /// What the client saw.
        #[source]
        source: bollard::errors::Error,
    },
    /// The engine refused or failed a request.
    #[error("the Docker Engine could not {op} {target}")]
    Engine {
        /// What was asked (`create the container for`, `pull`, ...).
        op: &'static str,
        /// Its subject: an image reference or a container id.
        target: String,
        /// The engine's answer.
        #[source]
        source: bollard::errors::Error,
    },
    /// The agent binary could not be found or read.
    #[error("the agent binary {path} could not be read (build it: cargo build -p omabox-agent)")]
    AgentBinary {
        /// The path (or the paths tried).
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The container started but its agent did not complete the handshake (the container
    /// was removed again).
    #[error("could not connect to the agent of container {id} (its stderr: {stderr:?})")]
    Connect {
        /// Container id.
        id: String,
        /// The container's stderr, capped at 4 KiB, escaped by `{:?}`.
        stderr: String,
        /// Why the handshake failed.
        #[source]
        source: ClientError,
    },
    /// The agent refused or failed an operation.
    #[error("{op} {target:?} failed")]
    Agent {
        /// What was attempted (`exec`, `read file`, ...).
        op: &'static str,
        /// Its subject: a command or a sandbox path (never an env value).
        target: String,
        /// The agent's answer.
        #[source]
        source: ClientError,
    },
    /// E2B's user could not be added to the container (`DockerConfig::user_home`).
    #[error(transparent)]
    UserAccount(omabox_agent_port::UserAccountError),
    /// The agent did not answer within the command's timeout plus the grace.
    #[error("the container's agent did not answer {op} {target:?} within {waited:?}")]
    Unresponsive {
        /// What was attempted.
        op: &'static str,
        /// Its subject.
        target: String,
        /// How long the host waited.
        waited: Duration,
    },
    /// The networking config does not compile (a bad host entry).
    #[error("networking: {0}")]
    Networking(omabox_contract::networking::NetworkingError),
    /// A networking config other than `none` on an engine that is not on this machine:
    /// the host serves a container's network inside its namespace, which it can only do
    /// for a local engine's containers.
    #[error(
        "networking other than none needs a local Docker Engine (a unix socket); the engine at {host} is not local"
    )]
    RemoteNetwork {
        /// The engine's address.
        host: String,
    },
    /// The container's network namespace could not be opened from this host (its PID 1 is
    /// gone, or is not a process of this host's pid namespace).
    #[error("could not open the network namespace of container {id}")]
    Namespace {
        /// Container id.
        id: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The host side of the container's network failed to start or change.
    #[error("the container's network")]
    Network(#[source] omabox_sandbox_net::NetworkError),
    /// The test hosts are not `NAME=IP,...`.
    #[error("test hosts: {0}")]
    TestHosts(String),
    /// The image's CA bundle is larger than omabox reads.
    #[error("the container's {path} is larger than {max} bytes")]
    CaBundle {
        /// The bundle's path in the container.
        path: &'static str,
        /// The cap.
        max: usize,
    },
    /// The sandbox was started under networking `none`: it has no network to change.
    #[error(
        "the sandbox was started with networking none; start it with another config to change its network later"
    )]
    NoNetwork,
    /// The sandbox was destroyed; it accepts no more work.
    #[error("the docker sandbox {id} was destroyed")]
    Destroyed {
        /// Sandbox id.
        id: String,
    },
}

/// `error: source: source...`, since a [`PortError`] carries one message only.
pub(crate) fn chain(error: &dyn StdError) -> String {
    let mut text = error.to_string();
    let mut next = error.source();
    while let Some(e) = next {
        let _ = write!(text, ": {e}");
        next = e.source();
    }
    text
}

impl From<DockerError> for PortError {
    fn from(error: DockerError) -> Self {
        let message = chain(&error);
        let invalid = matches!(
            &error,
            DockerError::Networking(_) | DockerError::RemoteNetwork { .. } | DockerError::NoNetwork
        ) || matches!(
            &error,
            DockerError::Agent { source, .. }
                if matches!(
                    source.remote_kind(),
                    Some(ErrorKind::InvalidRequest | ErrorKind::UnsafePath)
                ) || matches!(source, ClientError::UnknownSignal(_))
        );
        if invalid {
            PortError::invalid_argument(message)
        } else {
            PortError::new(message)
        }
    }
}

/// `error` and each of its sources, joined by ": " (how a failure is shown to a user: the
/// engine's own words are usually in a source).
pub fn describe(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut next = error.source();
    while let Some(source) = next {
        text.push_str(": ");
        text.push_str(&source.to_string());
        next = source.source();
    }
    text
}
