//! `omabox-agent-port`: what every backend whose sandbox's PID 1 is `omabox-agent` shares
//! behind the tool-sandbox seam, over `omabox_agent::client`.
//!
//! - [`process`]: the duplex and background process controls (`SIGTERM` escalated to
//!   `SIGKILL`, kill, logs, status) and the exit a port reports.
//!
//! The linux and docker backends use it; the gvisor backend can. It must never signal
//! anything on the host (only agent requests), nor name a backend: each backend gives it
//! its own error mapping. It depends on `omabox-contract`, `omabox-sandbox` and
//! `omabox-agent` only.

pub mod process;
