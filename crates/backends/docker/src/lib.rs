//! `omabox-backend-docker`: the tool sandbox as a container of a Docker Engine.
//!
//! The engine is reached through the Engine API with [bollard](https://docs.rs/bollard)
//! (the kept Rust client), at `DOCKER_HOST` or the default socket
//! (`unix:///var/run/docker.sock`), the API version negotiated with the daemon. Every
//! container runs omabox's own agent (`omabox-agent --stdio`) as its PID 1, and the host
//! drives it with [`omabox_agent::client::AgentClient`] over the container's attach stream
//! (stdin and the demultiplexed stdout; the container's stderr is kept, capped, for the
//! error when the agent never answers). So exec, files, background processes and env vars
//! are the same agent operations the linux backend sends; paths are resolved by the agent
//! inside the container, never by the host.
//!
//! # What a container gets
//!
//! [`container::container_body`] is the one place a container is described:
//!
//! - the image (a registry reference is pulled through the engine when the engine does not
//!   have it; a local reference the engine has is used as is);
//! - the agent binary, copied in by the archive API before the start (not a host mount);
//! - the labels `omabox.sandbox=<id>` and `omabox.host=<host id>`, so `omabox reap` finds
//!   the containers of a dead host ([`reap`]);
//! - no privilege: not privileged, every capability dropped but the seven the agent's
//!   file and process operations need (`CHOWN`, `DAC_OVERRIDE`, `FOWNER`, `FSETID`,
//!   `KILL`, `SETGID`, `SETUID`), `no-new-privileges`, a private IPC namespace;
//! - network mode `none`: a namespace with a loopback interface only; under a networking
//!   config other than `none` the host serves the DNS stub, the egress relay and the
//!   gateway inside it ([`network`]; a local engine only), and the sysctl
//!   `net.ipv4.ip_unprivileged_port_start=1024` keeps the ports it binds there its own;
//!   credential egress ([`DockerSandboxPort::attach_credentials`], the managed driver's
//!   port) is the linux backend's, shared through `omabox-sandbox-net`;
//! - memory, CPU and pids limits;
//! - the only host paths it sees are the bindings: the workspace at `/workspace` and,
//!   when given, the Session outputs at `/mnt/session/outputs`.
//!
//! The container dies with its host connection: stdin is closed when the attach stream
//! ends (`StdinOnce`), the agent then kills what it started and exits, and
//! [`DockerSandboxPort::terminate`] removes the container (forced) in any case.
//!
//! # What this crate must never do
//!
//! - Start a privileged container, add a capability beyond the list above, or mount a host
//!   path that is not a binding the caller named.
//! - Put an environment value in an error or log line (they may be secrets), or the
//!   container's output unbounded in memory.
//! - Depend on the host, the store, the CLI or another backend (the enforced network is
//!   `omabox-sandbox-net`'s, shared with the linux backend).

pub mod catalog;
pub mod config;
pub mod container;
mod engine;
mod error;
/// Host ids (shared with the other backends: `omabox_sandbox::host_id`).
pub use omabox_sandbox::host_id as host;
pub mod managed;
pub mod network;
mod port;
pub mod reap;

pub use config::{AGENT_BINARY, DockerConfig, DockerLimits, HOST_LABEL, SANDBOX_LABEL};
pub use engine::Engine;
pub use error::{DockerError, describe};
pub use network::DockerNetwork;
pub use omabox_sandbox_net::GatewayAccess;
pub use port::{DEFAULT_EXEC_TIMEOUT, DockerSandboxPort, PROVIDER};
