//! The ACP harness: an [Agent Client Protocol](https://agentclientprotocol.com/) agent run as
//! the work item's harness (reference §10, "ACP over the sandbox").
//!
//! [`AcpHarnessDriver`] serves the `ama_worker` lane: the declared process is the agent's
//! command, spawned in the session sandbox as a duplex process (no duplex support → the
//! contract's `SandboxAcpUnsupportedError` text), and omabox is the ACP client on its stdio
//! (the `agent-client-protocol` crate; no hand-rolled JSON-RPC). One turn: `initialize`
//! (bounded), `session/resume` (or `session/load`) of the saved session, or `session/new`, one `session/prompt`,
//! `session/cancel` on abort, close. The agent's updates become the canonical event log
//! ([`events`]); its permission requests are answered by a [`PermissionPolicy`]; after the
//! turn the session id is saved in `/workspace/.openma/harness-state/acp.json` ([`state`])
//! for the next run of the session.
//!
//! The agent is untrusted: a message is at most [`wire::MAX_MESSAGE_BYTES`], every text it
//! feeds into an event is capped, and a turn emits a bounded number of events. This crate
//! never logs or stores an env value: the session token reaches the agent only through the
//! spawn-time env ([`omabox_sandbox::managed::HarnessEnvSource`]).
//!
//! [`agents`] names the agents omabox installs itself (`--agent claude|codex`) and their
//! inference adapters (pure data: the CLI installs the package and mounts it).
//!
//! Depends on `contract` and `sandbox` only; the CLI wires it.

#![forbid(unsafe_code)]

pub mod agents;
mod driver;
pub mod events;
pub mod live;
pub mod state;
mod turn;
pub mod wire;

pub use driver::{AcpHarnessDriver, AcpTurnOptions, SANDBOX_ACP_UNSUPPORTED};
pub use events::{AcpEvent, AcpEventSink};
pub use live::{AcpAgentSlot, LiveAcpAgent, WarmAcpHarness};
pub use turn::{AcpTurnError, PermissionPolicy};
