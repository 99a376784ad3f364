//! The managed runtime host: everything OpenMA's `managed-runtime-host` package does, provider
//! blind.
//!
//! - [`plan`]: which strategies a profile gets from a set of capabilities.
//! - [`registry`], [`loader`], [`provider_host`]: admit a provider driver against a profile,
//!   descriptor first, then its live ports.
//! - [`runtime_host`]: the fenced transaction around one work item (fence claim → workspace →
//!   outputs → egress → acquire → attach → harness → checkpoint → publish → cleanup).
//! - [`router`], [`supervisor_driver`]: the harness driver lanes (the JSON-Lines supervisor
//!   channel over a process's stdin/stdout lives in `omabox-sandbox`, next to the processes
//!   it runs over, so backends can use it without depending on this crate).
//! - [`reconciler`]: reaps orphans whose terminate failed; [`lease_journal`]: journals every
//!   lease and reaps those a dead host abandoned (omabox extension).
//! - [`session_tokens`]: issues a claim's session token on fence acquire and revokes it on
//!   release, handing it to the caller's harness-env projection (omabox extension).
//! - [`run_observer`]: the named steps of a run, reported (redacted) to a front end;
//!   [`work_item`]: one work item composed — scope policy, admission with decorated
//!   resources, the transaction — the runner `omabox run` (and later `omabox serve`) uses.
//! - [`catalog`]: the conformance catalog of known providers.
//!
//! This crate never names a concrete backend and does no I/O of its own beyond timers: every
//! effect goes through a port from `omabox-contract` (the JSON-Lines channel reads and writes
//! only the streams a backend hands it).

#![forbid(unsafe_code)]

pub mod catalog;
pub mod lease_journal;
pub mod loader;
pub mod plan;
pub mod provider_host;
pub mod reconciler;
pub mod registry;
pub mod router;
pub mod run_observer;
pub mod runtime_host;
pub mod scheduler;
pub mod session_tokens;
pub mod supervisor_driver;
pub mod work_item;
