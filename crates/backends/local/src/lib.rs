//! `local-subprocess`: the tool sandbox as plain host subprocesses. **No isolation.**
//!
//! This backend exists so the contract's conformance suite and the host's tests can run
//! anywhere. A command run here can read and write anything the test process can; an agent
//! running `rm -rf /` hits the host. It must never serve real work: the factory refuses to
//! create a sandbox unless test mode is on (`OMABOX_TEST_MODE=1`, or OpenMA's `NODE_ENV=test`),
//! and the provider map selects it only through `OPENMA_TEST_SANDBOX_PROVIDER=local-subprocess`
//! in test mode (see `omabox-sandbox`).
//!
//! # Paths
//!
//! The file API (read/write file, file bytes, duplex `cwd`) maps sandbox paths to host paths:
//!
//! | sandbox path                       | host path                         |
//! |------------------------------------|-----------------------------------|
//! | `/workspace`, `/workspace/<rest>`  | `<workdir>/<rest>`                |
//! | `<relative>`                       | `<workdir>/<relative>`            |
//! | `/mnt/session/outputs[/<rest>]`    | `<outputsRoot>/<rest>`; an error when no outputs root |
//! | any other absolute path            | an error                          |
//!
//! A `..` that climbs above the root, or an existing path that resolves through a symlink
//! outside its root, is rejected with an error naming the path. Environment values set
//! through `setEnvVars` or a duplex spec that are `/workspace` paths are translated to host
//! paths. Commands themselves see host paths: cwd is the workdir, `PWD` is the workdir, and
//! `OMA_OUTPUTS_DIR` is the outputs root when one is configured.
//!
//! # Exec output
//!
//! As OpenMA's local adapter: stdout, `"\n" + stderr` when non-empty, trailing whitespace
//! trimmed, then `"\n[exit exit=<n>]"` or `"\n[exit signal=<SIG>]"` unless the status is 0
//! (other backends write `"[exit <n>]"`; readers match the `[exit ` prefix). The default
//! timeout is 120 s; on timeout the command's process group gets `SIGTERM`, then `SIGKILL`
//! one second later.
//!
//! # Cleanup
//!
//! Every process leads its own process group. Destroy (and drop) `SIGKILL`s every group that
//! is still alive, refuses further work, and removes the workdir if the sandbox created it
//! (an existing workdir is left in place).
//!
//! # Managed runtime
//!
//! [`managed`] is the `local` managed-runtime provider driver (test mode only) over
//! `omabox_sandbox::managed`.
//!
//! This crate must never be registered as a production provider, and must never grow a
//! capability it does not really implement (it has no memory mounts, outputs mount, backup
//! or runtime lifecycle).

#![forbid(unsafe_code)]

pub mod catalog;
mod error;
mod factory;
mod group;
pub mod managed;
mod paths;
mod process;
mod sandbox;

pub use error::LocalSandboxError;
pub use factory::LocalSubprocessFactory;
pub use sandbox::{
    DEFAULT_EXEC_TIMEOUT_MS, LocalSubprocessOptions, LocalSubprocessSandbox, format_exec_output,
};
